"""An OpenAI python grader: grade(sample, item) -> float, here a length penalty in [0, 1]."""


def grade(sample, item):
    words = len(sample["output_text"].split())
    limit = int(item.get("max_words", 20))
    return 1.0 if words <= limit else max(0.0, 1.0 - (words - limit) / limit)
