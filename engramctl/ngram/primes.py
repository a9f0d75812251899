"""Prime search for the hash table sizes: deterministic Miller-Rabin, exact for every int64.

Written here rather than taken from sympy (the demo's choice) so that the table sizes, which every
stored row id depends on, do not hinge on an optional dependency.
"""

from __future__ import annotations

# These bases make Miller-Rabin exact below 3.3e24, far above any int64 a table size can be.
_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in _BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(after: int, taken: set[int]) -> int:
    """The smallest prime strictly greater than `after` that is not in `taken`."""
    n = after + 1
    while not is_prime(n) or n in taken:
        n += 1
    return n
