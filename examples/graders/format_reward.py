"""Format reward (Vertex code-execution form): exactly one \\boxed{} answer, and not a wall of text."""

import re


def evaluate(example: dict, response: dict) -> float:
    text = "".join(part.get("text", "") for part in response.get("parts", []))
    boxes = re.findall(r"\\boxed\{[^}]*\}", text)
    if len(boxes) != 1:
        return -1.0
    return 1.0 if len(text) <= 2000 else 0.0
