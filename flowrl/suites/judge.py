"""The VQA judges of the suites that ask a vision-language model about an image (GenEval 2, DPG-Bench,
T2I-CompBench): a judge is ``judge(image, question, spellings) -> probability``, the probability the model gives
one of ``spellings`` as the first token of its answer (summed over them).

``judge`` settings: ``"transformers:PATH"`` a local transformers vision-language model in process,
``"openai:URL"`` (or ``"openai:URL#MODEL"``) a served one over the OpenAI chat protocol with first-token
log-probabilities (a spelling counts when the served top list holds it verbatim), or ``"module:function"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.suites.interface import named_function

SUFFIX = " Answer in one word."  # GenEval 2's instruction after each question
YES = ["Yes", "yes", " yes", " Yes"]
NO = ["No", "no", " no", " No"]
Judge = Callable[[Tensor, str, list[str]], float]


def transformers_judge(path: str, suffix: str = SUFFIX) -> Judge:
    """A local transformers vision-language model: the probabilities of its first answer token."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True).eval()
    except (OSError, ImportError, ValueError) as error:  # no such folder; a processor needing a missing extra
        raise UserError(f"judge transformers:{path}: cannot load a vision-language model there ({error})") from None
    tokenizer = processor.tokenizer

    @torch.no_grad()
    def probability(image: Tensor, question: str, forms: list[str]) -> float:
        pixels = (image.float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question + suffix}]}]
        chat = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(text=[chat], images=[Image.fromarray(pixels)], return_tensors="pt").to(model.device)
        # one greedy token through generate(), as GenEval 2's source does: its first-step scores include the
        # model's logits processors (a repetition penalty of its generation config, say)
        out = model.generate(**inputs, max_new_tokens=1, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
        probs = out.scores[0][0].float().softmax(-1)
        ids = [tokenizer.encode(form, add_special_tokens=False)[0] for form in forms]
        return float(sum(probs[i] for i in ids))

    return probability


def openai_judge(address: str, suffix: str = SUFFIX) -> Judge:
    """A served judge: one chat request per question, ``max_tokens = 1`` with the top 20 log-probabilities."""
    from flowrl.rewards.http import Endpoint
    from flowrl.rewards.wire import encode_image

    url, _, model = address.partition("#")
    endpoint = Endpoint(url, 300.0, retries=2, backoff_s=2.0)

    def probability(image: Tensor, question: str, forms: list[str]) -> float:
        data = encode_image(image, "png")["data"]
        content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                   {"type": "text", "text": question + suffix}]
        body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0,
                "max_tokens": 1, "logprobs": True, "top_logprobs": 20}
        answer = endpoint.post("/v1/chat/completions", body)
        try:
            top = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            found = {str(t["token"]): math.exp(float(t["logprob"])) for t in top}
        except (KeyError, IndexError, TypeError, ValueError):
            raise UserError(f"judge {url}: the answer has no choices[0].logprobs.content[0].top_logprobs") from None
        return sum(found.get(form, 0.0) for form in forms)

    return probability


def resolve_judge(name: str, suite: str, suffix: str = SUFFIX) -> Judge:
    """The judge a suite's ``judge`` setting names; ``suffix`` follows each question (the suite's instruction)."""
    kind, _, rest = name.partition(":")
    if kind == "transformers" and rest:
        return transformers_judge(rest, suffix)
    if kind == "openai" and rest:
        return openai_judge(rest, suffix)
    if rest and kind:
        return named_function(name, f"suite {suite}: judge")  # type: ignore[no-any-return]
    raise UserError(f"suite {suite} needs a judge: judge = \"transformers:PATH\", \"openai:URL#MODEL\" or "
                    "\"module:function\" (docs/evaluation.md)")


def served_model(name: str) -> str:
    """The model name of a served judge setting (``openai:URL#MODEL``), lower case; "" for any other judge."""
    return name.partition("#")[2].lower() if name.startswith("openai:") else ""


def yes_share(judge: Judge, image: Tensor, question: str) -> float:
    """P(yes) / (P(yes) + P(no)) of the judge's first answer token (0.5 when it gives neither)."""
    yes, no = judge(image, question, YES), judge(image, question, NO)
    return yes / (yes + no) if yes + no > 0 else 0.5
