"""loadtest.soak_verdict on literal samples: it judges the RSS floor, first window to last."""

from __future__ import annotations

from loadtest.soak_verdict import verdict

KINDS = frozenset({"fresh"})


def samples(replica: list[float], step_s: float = 30.0) -> list[dict]:
    """One replica process (pid 7) and one ingress (pid 8, constant 300 MiB)."""
    return [
        {
            "t_s": i * step_s,
            "kinds_done": ["fresh"],
            "replica_rss_mib": {"7": mib},
            "ingress_rss_mib": {"8": 300.0},
            "proxy_rss_mib": {},
            "replica_less_cache_mib": {},
        }
        for i, mib in enumerate(replica)
    ]


def test_in_step_peaks_over_a_steady_floor_are_flat() -> None:
    # warm-up at 1000; samples in large steps reach 1080 (+8 %) mid-run; floor stays 1000.
    rss = [1000, 1040, 1000, 1080, 1075, 1000, 1002, 1060, 1001, 1010, 1003, 1020]
    result = verdict(samples(rss), warmup_s=0, tolerance_pct=5.0, kinds=KINDS)
    replica = result["replica"]["processes"]["7"]
    assert (replica["max_mib"], replica["max_change_pct"]) == (1080, 8.0)
    assert (replica["floor_first_mib"], replica["floor_last_mib"]) == (1000, 1001)
    assert replica["flat"] and result["flat"]


def test_a_rising_floor_is_growth_even_with_a_flat_peak() -> None:
    # Floor 1000 in the first 2 minutes, 1060 (+6 %) in the last 2; peaks never above 1080.
    rss = [1000, 1080, 1000, 1080, 1030, 1080, 1045, 1080, 1060, 1080, 1060, 1080]
    result = verdict(samples(rss), warmup_s=0, tolerance_pct=5.0, kinds=KINDS)
    replica = result["replica"]["processes"]["7"]
    assert replica["floor_change_pct"] == 6.0
    assert not replica["flat"] and not result["flat"]
