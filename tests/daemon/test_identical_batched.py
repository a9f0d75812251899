"""N identical greedy requests sent at once get N identical replies (issue 19's test), through the daemon's
HTTP interface on the llama.cpp backend, where they really are stepped together: the requests are let in
while the worker is held, so they are admitted in one step, prefilled in one llama_decode and decoded
together. On the tiny f32 GGUF that is also the reply each gets alone. (On a quantized model a batched row
may differ from a solo one: docs/batching.md.)"""

from __future__ import annotations

import threading
import time

import openai

from tests.helpers.inprocess import InProcessDaemon

N = 4
ASK = [{"role": "user", "content": "Say the same thing four times."}]


def test_n_identical_greedy_requests_at_once_get_n_identical_replies(tiny_engine, engram_home):
    engine = tiny_engine("llama.cpp")
    assert engine.max_sequences >= N
    widths: list[int] = []
    step = engine.step

    def counted(work):  # the real step; only how many conversations shared it is noted
        widths.append(len(work))
        return step(work)

    with InProcessDaemon(engine) as d:
        client = openai.OpenAI(base_url=d.url + "/v1", api_key=d.daemon.token, max_retries=0, timeout=120)

        def ask(session: str) -> str:
            r = client.chat.completions.create(
                model="default", messages=ASK, max_tokens=16, temperature=0, extra_body={"session": session}
            )
            return r.choices[0].message.content

        alone = ask("alone")
        release = threading.Event()
        held = threading.Thread(target=d.daemon.worker.call, args=(lambda: release.wait(60),))
        held.start()
        replies: dict[int, str] = {}
        threads = [threading.Thread(target=lambda k=k: replies.__setitem__(k, ask(f"same-{k}"))) for k in range(N)]
        engine.step = counted
        try:
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60
            while d.daemon.worker.waiting < N:  # all N queued behind the held worker
                assert time.monotonic() < deadline, "the requests never reached the daemon"
                time.sleep(0.01)
            release.set()
            for t in threads:
                t.join(120)
        finally:
            engine.step = step
            release.set()
            held.join(60)
    assert max(widths) == N  # they were stepped together
    assert len(replies) == N and set(replies.values()) == {alone}, (alone, replies)
