import numpy as np

from bno_hvd.library.control.schedule import complete_matrix, partner_in, rounds_for_refresh, tournament_rounds


def all_pairs(n):
    return {(i, j) for i in range(n) for j in range(i + 1, n)}


def test_tournament_covers_every_pair_once_with_disjoint_rounds():
    for n in (2, 3, 4, 5, 8, 9):
        rounds = tournament_rounds(n)
        seen = [p for r in rounds for p in r]
        assert sorted(seen) == sorted(all_pairs(n))
        for r in rounds:
            ranks = [x for p in r for x in p]
            assert len(ranks) == len(set(ranks)), "a rank is in two pairs of one round"
    assert tournament_rounds(1) == []


def test_sampled_rounds_rotate_and_bound_cost():
    n = 64
    covered = set()
    for refresh in range(63 // 8 + 1):
        rounds = rounds_for_refresh(n, refresh, 8)
        assert len(rounds) == 8  # per-rank cost per refresh: constant in N
        covered |= {p for r in rounds for p in r}
    assert covered == all_pairs(n)


def test_partner_lookup():
    assert partner_in([(0, 3), (1, 2)], 3) == 0
    assert partner_in([(0, 3)], 1) is None


def test_complete_matrix_symmetric_zero_diagonal_fills_median():
    nan = np.nan
    rows = np.array([[0, 1.0, nan], [3.0, 0, nan], [nan, nan, 0]])
    m = complete_matrix(rows)
    assert m[0, 1] == m[1, 0] == 2.0
    assert m[0, 2] == m[2, 1] == 2.0  # median of measured pairs
    assert np.all(np.diag(m) == 0) and np.allclose(m, m.T)
