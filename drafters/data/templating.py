"""Chat templating with the verifier's template and assistant-only loss masks.

The SmolLM2 template has no ``{% generation %}`` markers, so ``return_assistant_tokens_mask``
returns all zeros there. The mask is computed by rendering the conversation prefix by prefix:
the tokens an assistant turn adds (its content and end-of-turn token) are the loss positions.
"""
from __future__ import annotations

from dataclasses import dataclass

from drafters.data.records import BenchmarkPrompt, Conversation


@dataclass(frozen=True)
class TokenizedExample:
    id: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 on assistant tokens, 0 elsewhere


def _messages(turns) -> list[dict]:
    return [{"role": r, "content": c} for r, c in turns]


def render_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer, history: list[dict]) -> list[int]:
    """Token ids of a conversation so far, ending with the assistant generation prompt."""
    return render_ids(tokenizer, history, add_generation_prompt=True)


def tokenize_conversation(tokenizer, conv: Conversation, max_length: int,
                          eos_ids: list[int]) -> TokenizedExample:
    """Tokenize with the chat template; loss mask = assistant content + its end-of-turn token.

    Truncates to ``max_length`` tokens. Raises ValueError if the template does not render
    prefixes as prefixes (then prefix diffing would be wrong and masks silently broken).
    """
    msgs = _messages(conv.turns)
    full = render_ids(tokenizer, msgs, add_generation_prompt=False)
    mask = [0] * len(full)
    eos = set(eos_ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = len(render_ids(tokenizer, msgs[:i], add_generation_prompt=True))
        upto = render_ids(tokenizer, msgs[: i + 1], add_generation_prompt=False)
        if full[: len(upto)] != upto or upto[:start] != full[:start]:
            raise ValueError(f"chat template does not render conversation {conv.id!r} prefix-consistently")
        end = len(upto)
        # the template may append text after the end-of-turn token (ChatML adds "\n"): not loss
        while end > start and upto[end - 1] not in eos:
            end -= 1
        if end == start:
            end = len(upto)  # no end-of-turn token in this template: keep the whole span
        for t in range(start, end):
            mask[t] = 1
        if start >= max_length:
            break
    return TokenizedExample(conv.id, full[:max_length], mask[:max_length])


def benchmark_prompt_ids(tokenizer, prompt: BenchmarkPrompt, turn: int, previous_answers: list[str],
                         system: str | None = None) -> list[int]:
    """Ids for ``turn`` (0-based) of a benchmark prompt, with earlier answers as assistant turns;
    ``system``: a system turn first (else the template's own default, if it has one)."""
    history = [{"role": "system", "content": system}] if system else []
    for k in range(turn):
        history += [{"role": "user", "content": prompt.turns[k]}, {"role": "assistant",
                                                                   "content": previous_answers[k]}]
    history.append({"role": "user", "content": prompt.turns[turn]})
    return prompt_ids(tokenizer, history)
