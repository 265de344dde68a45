"""``loadtest.soak``'s verdict: from its samples, whether each serving process's RSS stayed
flat after warm-up (its floor in the last window against its floor in the first), and that
the scoring replica survived alone. Pure: tests judge literal samples."""

from __future__ import annotations

KINDS = ("repeat", "fresh", "tokens", "item_first", "invalid")


def change_pct(base: float, value: float) -> float:
    return round(100.0 * (value - base) / base, 2)


def judge(after: list[dict], key: str, tolerance_pct: float, window_s: float = 120.0) -> dict:
    """Per process present at warm-up: warm-up, largest and last RSS (while it lived), and
    its floor (smallest sample) in the first and the last ``window_s`` of its samples.

    "Flat" judges the floor: what the process keeps between steps, last window against first.
    A single sample lands anywhere in a step's working memory (activations freed when the step
    ends), so the largest sample against the warm-up sample measured when samples happened to
    fall, not growth; both are still reported. Memory that is kept raises the floor.
    """
    warm = after[0][key]
    if not warm:
        return {"missing": True, "flat": False}
    entry: dict = {"processes": {}}
    for pid, base in warm.items():
        seen = [(s["t_s"], s[key][pid]) for s in after if pid in s[key]]
        peak_t, peak = max(seen, key=lambda ts: ts[1])
        first = min(mib for t, mib in seen if t < seen[0][0] + window_s)
        last = min(mib for t, mib in seen if t > seen[-1][0] - window_s)
        gone = after[-1][key].get(pid) is None
        entry["processes"][pid] = {
            "warmup_mib": base,
            "max_mib": peak,
            "max_at_s": peak_t,
            "final_mib": seen[-1][1],
            "max_change_pct": change_pct(base, peak),
            "final_change_pct": change_pct(base, seen[-1][1]),
            "floor_first_mib": first,
            "floor_last_mib": last,
            "floor_change_pct": change_pct(first, last),
            "gone_at_s": seen[-1][0] if gone else None,
            "flat": abs(change_pct(first, last)) <= tolerance_pct,
        }
    born = sorted({pid for s in after for pid in s[key]} - set(warm))
    entry["started_after_warmup"] = born
    procs = entry["processes"].values()
    entry["flat"] = all(p["flat"] for p in procs)
    entry["all_survived"] = all(p["gone_at_s"] is None for p in procs)
    return entry


def verdict(
    samples: list[dict], warmup_s: float, tolerance_pct: float, kinds: frozenset = frozenset(KINDS)
) -> dict:
    warm = next(
        (s for s in samples if s["t_s"] >= warmup_s and kinds <= set(s["kinds_done"])), None
    )
    result: dict = {"warmup_sample_t_s": warm and warm["t_s"], "tolerance_pct": tolerance_pct}
    if warm is None:
        result["flat"] = False
        result["why"] = "no sample after warm-up"
        return result
    after = [s for s in samples if s["t_s"] >= warm["t_s"]]
    for role in ("replica", "ingress", "proxy"):
        result[role] = judge(after, f"{role}_rss_mib", tolerance_pct)
    result["replica_less_cache"] = judge(after, "replica_less_cache_mib", tolerance_pct)
    # Judged: the scoring replica (which must also survive, and not be joined by another)
    # and every ingress process alive at warm-up (Serve may scale the ingress 1..2).
    replica, ingress = result["replica"], result["ingress"]
    result["flat"] = (
        replica["flat"]
        and replica.get("all_survived", False)
        and not replica.get("started_after_warmup")
        and ingress["flat"]
    )
    return result
