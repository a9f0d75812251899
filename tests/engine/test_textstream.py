from engramctl.engine.textstream import IncrementalDetokenizer, StopMatcher


def byte_decode(vocab):
    return lambda ids: b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def test_multibyte_character_split_across_tokens_is_never_emitted_half():
    # "é" is 0xC3 0xA9 and "日" is 0xE6 0x97 0xA5; split them over tokens like a byte-level BPE does.
    vocab = {0: b"a", 1: b"\xc3", 2: b"\xa9", 3: b"\xe6", 4: b"\x97", 5: b"\xa5", 6: b"!"}
    d = IncrementalDetokenizer(byte_decode(vocab))
    pieces = [d.push(t) for t in [0, 1, 2, 3, 4, 5, 6]]
    assert pieces == ["a", "", "é", "", "", "日", "!"]
    assert all("\ufffd" not in p for p in pieces)


def test_stop_matcher_holds_back_possible_stop_and_cuts_at_it():
    s = StopMatcher(("END",))
    assert s.push("hello E") == ("hello ", False)
    assert s.push("N") == ("", False)
    assert s.push("Dx") == ("", True)


def test_stop_matcher_releases_false_alarm():
    s = StopMatcher(("END",))
    assert s.push("xE") == ("x", False)
    assert s.push("nd") == ("End", False)
    assert s.flush() == ""


def test_stop_matcher_without_stops_passes_everything():
    s = StopMatcher(())
    assert s.push("abc") == ("abc", False)
