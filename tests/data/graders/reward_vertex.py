"""A Vertex code-execution reward: evaluate(example, response) -> float."""


def evaluate(example, response):
    text = "".join(part.get("text", "") for part in response.get("parts", []))
    answer = example.get("references", {}).get("answer", "")
    print(f"comparing {text!r} with {answer!r}")
    if not answer:
        raise ValueError("the example has no references.answer")
    return 1.0 if answer.lower() in text.lower() else -1.0
