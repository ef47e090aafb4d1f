"""Prompt templates, one per task family, each with a version string.

A run records :func:`prompt_version`, so any change to a template's wording
must bump its version: the prompt is part of the experiment. The templates
are short on purpose; small models with short response caps do better with
one clear instruction about the answer format the verifier reads.
"""

from __future__ import annotations

from grpo_knobs.data import Problem, task_family

PROMPT_VERSIONS = {"gsm8k": "gsm8k-v1", "countdown": "countdown-v1"}

GSM8K_TEMPLATE = (
    "{question}\n\n"
    "Reason step by step, then give the final answer as a number on its own last "
    "line, in the form: #### <number>"
)

COUNTDOWN_TEMPLATE = (
    "Using the numbers {numbers}, create an equation that equals {target}. "
    "Use each number exactly once with + - * / and parentheses. "
    "Show your work, then give the final expression in <answer> </answer> tags, "
    "e.g. <answer>(1 + 2) / 3</answer>."
)


def prompt_version(task: str) -> str:
    """The template version a task's prompts are built with (recorded per run)."""
    return PROMPT_VERSIONS[task_family(task)]


def prompt_text(problem: Problem) -> str:
    """The user message for ``problem``, before any chat template."""
    if task_family(problem.task) == "gsm8k":
        return GSM8K_TEMPLATE.format(question=problem.question)
    return COUNTDOWN_TEMPLATE.format(numbers=list(problem.numbers), target=problem.answer)


def build_messages(problem: Problem) -> list[dict]:
    """Chat messages for ``problem``: a single user turn.

    No system turn is added; chat templates that want one (SmolLM2's) insert
    their default themselves.
    """
    return [{"role": "user", "content": prompt_text(problem)}]


def render_prompt(problem: Problem, tokenizer) -> str:
    """The prompt string the model continues: chat template plus generation prompt."""
    return tokenizer.apply_chat_template(build_messages(problem), tokenize=False, add_generation_prompt=True)
