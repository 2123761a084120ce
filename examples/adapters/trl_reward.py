"""TRL GRPO with a gradekit grader as an async reward function.

Dataset columns other than ``prompt`` (here ``answer``) arrive as references, so the grader's
``{{references.answer}}`` is the row's answer. TRL logs the reward as ``rewards/math_answer/mean``.
Run: python trl_reward.py   (needs: pip install trl datasets)
"""

from pathlib import Path

from gradekit.graders import trl_reward_func

GRADER = Path(__file__).resolve().parent.parent / "graders" / "math_answer.yaml"

# Invalid rows (no answer column value) give None: TRL skips this reward for them.
math_answer = trl_reward_func(GRADER, name="math_answer")

if __name__ == "__main__":
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list([{"prompt": "What is 999 + 1? Put the answer in \\boxed{}.", "answer": "1000"}] * 64)
    trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=[math_answer],
                          args=GRPOConfig(output_dir="grpo-math", num_generations=4, per_device_train_batch_size=4),
                          train_dataset=dataset)
    trainer.train()
