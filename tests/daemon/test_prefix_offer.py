"""A turn's prefill stops reach the conversation service (ConversationService.handle's PrefixState arm): the
state captured at each stop is kept as a prefix state (store.prefixes), and the turn is recorded as any other."""

from __future__ import annotations

from engramctl.daemon.service import ChatRequest
from engramctl.engine.sampling_params import SamplingParams
from tests.helpers import served_app


def test_the_states_at_a_turns_stops_are_kept_as_prefix_states(tiny_engine):
    with served_app(tiny_engine("transformers")) as c:
        svc, store = c.daemon.service, c.daemon.store
        params = SamplingParams(temperature=0.0, max_tokens=3)
        ask = [{"role": "user", "content": "Tell me about the sea."}]
        plain = svc.run(svc.chat(ChatRequest(ask, "plain", params)))
        assert store.prefixes.list() == []  # one user message, shorter than an interval: no stop
        seq = svc.chat(ChatRequest(ask, "stopped", params))
        seq.turn.stops = [4, 9]  # as the prefix states' owner would ask for them
        ids = [*seq.turn.live.token_ids, *seq.turn.feed]
        r = svc.run(seq)
        kept = sorted(store.prefixes.list(), key=lambda rec: rec.n_tokens)
        assert [rec.n_tokens for rec in kept] == [4, 9]
        for rec in kept:  # each holds exactly the prompt's first n tokens
            (found,) = store.candidates.find(ids[: rec.n_tokens], None, kinds=("prefix",), min_tokens=rec.n_tokens)
            assert (found.id, found.n_tokens) == (rec.id, rec.n_tokens)
        assert r.prompt_tokens == plain.prompt_tokens and r.snapshot_id is not None  # recorded as any turn
