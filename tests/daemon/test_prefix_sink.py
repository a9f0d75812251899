"""A turn's prefill stops reach the conversation service's prefix sink (ConversationService.prefix_sink): the
state captured at each stop is offered there, in order, and the turn is recorded as any other."""

from __future__ import annotations

from engramctl.daemon.service import ChatRequest
from engramctl.engine.sampling_params import SamplingParams
from engramctl.engine.turn import PrefixState
from tests.helpers import served_app


class Sink:
    def __init__(self):
        self.offered: list[PrefixState] = []

    def offer(self, event: PrefixState) -> None:
        self.offered.append(event)


def test_the_states_at_a_turns_stops_are_offered_to_the_prefix_sink(tiny_engine):
    with served_app(tiny_engine("transformers")) as c:
        svc = c.daemon.service
        params = SamplingParams(temperature=0.0, max_tokens=3)
        ask = [{"role": "user", "content": "Tell me about the sea."}]
        plain = svc.run(svc.chat(ChatRequest(ask, "plain", params)))
        svc.prefix_sink = Sink()
        seq = svc.chat(ChatRequest(ask, "stopped", params))
        seq.turn.stops = [4, 9]  # where the lead's owner of prefix states would ask for them
        r = svc.run(seq)
        assert [(e.n_tokens, len(e.token_ids), e.state.n_tokens) for e in svc.prefix_sink.offered] == [
            (4, 4, 4),
            (9, 9, 9),
        ]
        assert svc.prefix_sink.offered[1].token_ids[:4] == svc.prefix_sink.offered[0].token_ids
        assert r.prompt_tokens == plain.prompt_tokens and r.snapshot_id is not None  # recorded as any turn
