"""What choosing one token costs: `Sampler.pick` + `accept` on 49k-vocabulary logits, per sampling setup.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_sampling.py [--vocab 49152] [--tokens 200] [--rounds 7] [--json]

Each setup gets a fresh Sampler over a 64-token context (so the penalties have a window to look at), then
picks and accepts --tokens tokens from logits that change every token (a pool of realistic-looking logits:
a few strong candidates over a normal body, as a small chat model gives). Reported per token: the median
over --rounds of the wall time (perf_counter) and of the CPU time (process_time), with the rounds' spread.
The machine may be shared: keep it brief and read the medians. Issue 18's setup is `chat` (engramctl chat's
sampling defaults: engine/sampling_params.py CHAT_DEFAULTS).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engramctl.engine.sampling import Sampler
from engramctl.engine.sampling_params import CHAT_DEFAULTS, SamplingParams

POOL = 16  # distinct logits vectors cycled through (made once: making them is not what is measured)


class _Vocabulary:
    """What a Sampler reads of a ChatTokenizer here: the end-of-turn ids (logprobs read a token's bytes)."""

    eos_ids = frozenset({2})

    def decode(self, ids, skip_special: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)

    def token_bytes(self, token: int) -> bytes:
        return f"<{token}>".encode()


def setups() -> dict[str, SamplingParams]:
    chat = SamplingParams(**CHAT_DEFAULTS, seed=1)
    out = {
        "greedy": SamplingParams(temperature=0.0),
        # `bench serve` bans the end-of-generation tokens this way so that replies run to a fixed length
        "greedy+logit_bias-3": SamplingParams(temperature=0.0, logit_bias=((0, -100.0), (2, -100.0), (4, -100.0))),
        "chat": chat,
        "temperature-1": SamplingParams(temperature=1.0, seed=1),  # the API's defaults: the whole vocabulary
        "chat+penalties": SamplingParams(**CHAT_DEFAULTS, presence_penalty=0.5, frequency_penalty=0.3, seed=1),
    }
    if "logprobs" in SamplingParams.__dataclass_fields__:  # not before logprobs existed
        out["chat+logprobs-5"] = SamplingParams(**CHAT_DEFAULTS, seed=1, logprobs=5)
        out["greedy+logprobs-5"] = SamplingParams(temperature=0.0, logprobs=5)
    return out


def logits_pool(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    pool = []
    for _ in range(POOL):
        x = torch.randn(vocab, generator=g) * 2.0
        top = torch.randint(0, vocab, (8,), generator=g)
        x[top] += torch.linspace(12.0, 6.0, 8)  # a few strong candidates
        pool.append(x.float())
    return pool


def measure(params: SamplingParams, pool: list[torch.Tensor], tokens: int, rounds: int) -> dict:
    wall, cpu = [], []
    context = [(i * 7919) % len(pool[0]) for i in range(64)]
    for _ in range(rounds):
        sampler = Sampler(params, _Vocabulary(), context)
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(tokens):
            sampler.accept(sampler.pick(pool[i % POOL]))
        wall.append((time.perf_counter() - t0) * 1000 / tokens)
        cpu.append((time.process_time() - c0) * 1000 / tokens)
    return {
        "wall_ms": round(statistics.median(wall), 4),
        "wall_spread_ms": round(max(wall) - min(wall), 4),
        "cpu_ms": round(statistics.median(cpu), 4),
        "cpu_spread_ms": round(max(cpu) - min(cpu), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)  # SmolLM2's
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", nargs="*", help="setups to run (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the daemon's worker decodes on one thread; torch's pool would only add noise
    pool = logits_pool(args.vocab)
    results = {}
    for name, params in setups().items():
        if args.only and name not in args.only:
            continue
        measure(params, pool, 20, 1)  # warm-up: first-call costs are not per token
        results[name] = measure(params, pool, args.tokens, args.rounds)
    if args.json:
        print(json.dumps({"vocab": args.vocab, "tokens": args.tokens, "rounds": args.rounds, "per_token": results}))
        return
    print(f"per token, {args.vocab}-token vocabulary, median of {args.rounds} rounds of {args.tokens} tokens")
    print(f"{'setup':<20} {'wall ms':>9} {'(spread)':>9} {'cpu ms':>9} {'(spread)':>9}")
    for name, r in results.items():
        cells = [r[k] for k in ("wall_ms", "wall_spread_ms", "cpu_ms", "cpu_spread_ms")]
        print(f"{name:<20} " + " ".join(f"{c:>9.4f}" for c in cells))


if __name__ == "__main__":
    main()
