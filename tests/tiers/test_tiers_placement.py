"""LRU across two memory tiers (a stand-in "vram" on the CPU), by bytes."""

from __future__ import annotations

import random

from engramctl.tiers.placement import HotTier, Placement


def make(vram=300, ram=500, moves=None):
    def move(value, device):
        if moves is not None:
            moves.append((value, device))
        return value

    return Placement([HotTier("vram", vram, "cuda"), HotTier("ram", ram, "cpu")], move=move)


def test_fills_hottest_first_and_demotes_lru():
    p = make()
    for k in "abc":
        assert p.put(k, k, 100) == "vram"
    assert p.put("d", "d", 100) == "vram"  # evicts a from vram -> demoted into ram
    assert p.where("a") == "ram" and p.lru("vram") == ["b", "c", "d"]


def test_lru_order_follows_access_and_promotion():
    moves = []
    p = make(moves=moves)
    for k in "abcd":
        p.put(k, k, 100)
    p.get("b")
    p.put("e", "e", 100)  # vram LRU is c now (b was touched)
    assert p.lru("vram") == ["d", "b", "e"] and p.lru("ram") == ["a", "c"]
    assert p.promote("a") == "vram"  # restore promotes; vram's LRU (d) goes down
    assert p.lru("vram") == ["b", "e", "a"] and set(p.lru("ram")) == {"c", "d"}
    assert ("a", "cuda") in moves and ("d", "cpu") in moves


def test_too_big_skips_tier_and_budgets_never_exceeded():
    p = make(vram=300, ram=500)
    assert p.put("big", 1, 400) == "ram"  # bigger than vram: skips it
    assert p.put("huge", 1, 600) is None  # bigger than both: disk only
    rng = random.Random(0)
    for i in range(500):
        p.put(f"k{i}", i, rng.randint(1, 350))
        if rng.random() < 0.3:
            p.get(f"k{rng.randrange(i + 1)}")
        if rng.random() < 0.1:
            p.promote(f"k{rng.randrange(i + 1)}")
        for t in p.tiers:
            assert t.used <= t.budget and t.used == sum(e.nbytes for e in t.entries.values())


def test_held_entries_are_not_evicted():
    p = make(vram=200, ram=0)
    p.put("a", 1, 100)
    p.put("b", 1, 100)
    p.hold("a")
    p.hold("b")
    assert p.put("c", 1, 100) is None  # no room without evicting held ones: c skips the tiers
    p.release("a")
    assert p.put("c", 1, 100) == "vram" and p.where("a") is None and p.where("b") == "vram"


def test_demotion_does_not_displace_newer_entries():
    p = make(vram=100, ram=100)
    p.put("old", 1, 100)  # vram
    p.put("mid", 1, 100)  # vram; old -> ram
    p.get("old", touch=False)
    p.put("new", 1, 100)  # vram; mid is newer than old, so it displaces old in ram
    assert p.lru("vram") == ["new"] and p.lru("ram") == ["mid"] and p.where("old") is None


def test_shrinking_a_budget_evicts_at_once():
    p = make(vram=300, ram=300)
    for k in "abcde":
        p.put(k, k, 100)
    p.set_budget("vram", 100)
    assert p.tiers[0].used == 100 and p.lru("vram") == ["e"]
    assert p.tiers[1].used <= 300


def test_promotion_swaps_with_the_demoted_entry_when_both_tiers_are_full():
    moves = []
    p = make(vram=100, ram=100, moves=moves)
    p.put("a", "a", 100)
    p.put("b", "b", 100)  # vram; a -> ram
    assert p.promote("a") == "vram"  # b goes down into the slot a left, not out of memory
    assert p.lru("vram") == ["a"] and p.lru("ram") == ["b"]
    assert ("a", "cuda") in moves and ("b", "cpu") in moves
    p.hold("a")
    assert p.promote("b") == "ram"  # no room above without evicting a held entry: it stays where it was
    assert p.lru("vram") == ["a"] and p.lru("ram") == ["b"]
