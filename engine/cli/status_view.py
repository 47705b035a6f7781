"""What ``driftstream status`` and ``driftstream list`` print: plain text tables of a flow's
``status()`` and ``describe()``. Pure functions of those dicts (and of a previous status, for
rates), so they are tested without Ray.

>>> print(flow_table([{"name": "orders", "state": "running", "detached": True, "started_at": 0.0,
...                    "guarantee": "exactly-once", "parallelism": 2, "restarts": 0}], now=75.0))
NAME    STATE    UP     GUARANTEE     PARALLELISM  DETACHED  RESTARTS
orders  running  1m15s  exactly-once  2            yes       0
"""

from __future__ import annotations

import time
from typing import Optional


def duration(seconds: Optional[float]) -> str:
    """``3.2s``, ``4m05s``, ``2h03m``.

    >>> duration(3.21), duration(245), duration(7380), duration(None)
    ('3.2s', '4m05s', '2h03m', '-')
    """
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def table(rows: list) -> str:
    """Columns padded to their widest cell; the first row is the header."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def flow_table(flows: list, now: Optional[float] = None) -> str:
    """``driftstream list``: one row per flow on the cluster."""
    if not flows:
        return "no flows on this cluster"
    now = time.time() if now is None else now
    rows = [["NAME", "STATE", "UP", "GUARANTEE", "PARALLELISM", "DETACHED", "RESTARTS"]]
    for f in flows:
        started = f.get("started_at")
        rows.append([f["name"], f["state"], duration(None if started is None else now - started), f.get("guarantee", "-"),
                     f.get("parallelism", "-"), "yes" if f.get("detached") else "no", f.get("restarts", "-")])
    return table(rows)


def _count(n: Optional[float]) -> str:
    return "-" if n is None else f"{n:,.0f}"


def _rate(now: dict, before: Optional[dict], seconds: float, get) -> str:
    if before is None or seconds <= 0:
        return "-"
    a, b = get(before), get(now)
    return "-" if a is None or b is None else f"{(b - a) / seconds:,.0f}/s"


def recovery_steps(steps_s: dict) -> str:
    """Where a recovery's time to restored went (``status()["recoveries"][i]["steps_s"]``).

    >>> recovery_steps({"confirm": 0.021, "probe": 0.002, "reset": 0.1304, "connect": 0.027})
    'confirm 21 ms, probe 2 ms, reset 130 ms, connect 27 ms'
    """
    return ", ".join(f"{name} {seconds * 1000:,.0f} ms" for name, seconds in steps_s.items())


def recovery_resets(resets_s: dict) -> str:
    """How long each instance reset in place took (``status()["recoveries"][i]["resets_s"]``).

    >>> recovery_resets({"f/by_word/0 (standby)": {"tear_down": 0.0, "setup": 0.142, "restore": 0.077}})
    'f/by_word/0 (standby): tear_down 0 ms, setup 142 ms, restore 77 ms'
    """
    return "; ".join(f"{name}: {recovery_steps(parts)}" for name, parts in resets_s.items())


def status_view(info: dict, status: dict, before: Optional[dict] = None, seconds: float = 0.0, now: Optional[float] = None) -> str:
    """``driftstream status NAME``: the flow's figures now; rates over the ``seconds`` since
    the status ``before`` (None: no rates).

    >>> print(status_view({"name": "f", "state": "running", "started_at": 0.0, "guarantee": "none"},
    ...                   {"running": True, "emitted": 10, "released": 8, "source_lag": 2, "dead_letters": 0,
    ...                    "snapshots": 0, "recoveries": [], "steps": {"src": {"elements": 10}}}, now=1.0))
    flow f: running, up 1.0s, guarantee none
    emitted 10 (-), released 8 (-), source lag 2 records, dead letters 0
    watermark lag -, release latency -
    snapshots: none yet
    recoveries: none
    STEP  ELEMENTS  RATE  DEAD LETTERS
    src   10        -     0
    """
    now = time.time() if now is None else now
    started = info.get("started_at")
    lines = [f"flow {info['name']}: {info.get('state', '?')}, up {duration(None if started is None else now - started)}, "
             f"guarantee {info.get('guarantee', '?')}"]
    if not status.get("running", True):
        lines.append(f"ended: {status.get('error') or 'stopped or finished'}")
        return "\n".join(lines)
    lines.append(f"emitted {_count(status.get('emitted'))} ({_rate(status, before, seconds, lambda s: s.get('emitted'))}), "
                 f"released {_count(status.get('released'))} ({_rate(status, before, seconds, lambda s: s.get('released'))}), "
                 f"source lag {_count(status.get('source_lag'))} records, dead letters {_count(status.get('dead_letters'))}")
    lag = status.get("watermark_lag_s")
    latency = status.get("latency_ms") or {}
    percentiles = ", ".join(f"{p} {latency[p]:,.1f} ms" for p in ("p50", "p95", "p99") if latency.get(p) is not None) or "-"
    lines.append(f"watermark lag {duration(lag)}, release latency {percentiles}")
    last = status.get("last_snapshot")
    if last:
        lines.append(f"snapshots: {status.get('snapshots', 0):,} taken, last {duration(last.get('age_s'))} ago "
                     f"(took {duration(last.get('duration_s'))}), failures {status.get('snapshot_failures', 0)}")
        if status.get("snapshots_failing_s"):
            lines.append(f"  failing for {duration(status['snapshots_failing_s'])}: {status.get('last_snapshot_error')}")
    else:
        lines.append("snapshots: none yet")
    recoveries = status.get("recoveries") or []
    lines.append(f"recoveries: {len(recoveries)}" if recoveries else "recoveries: none")
    for r in recoveries[-3:]:
        lines.append(f"  at {time.strftime('%H:%M:%S', time.localtime(r['detected_at']))}: restored in {duration(r.get('restored_s'))}, "
                     f"first new output after {duration(r.get('first_output_s'))}")
        if r.get("steps_s"):
            lines.append("    " + recovery_steps(r["steps_s"]))
    for r in (status.get("rescales") or [])[-3:]:
        lines.append(f"  rescaled {r['from']} -> {r['to']} at {time.strftime('%H:%M:%S', time.localtime(r['at']))}: drained in "
                     f"{duration(r.get('drain_s'))}, restarted in {duration(r.get('restart_s'))}, first output after "
                     f"{duration(r.get('first_output_s'))}")
    groups = status.get("key_groups") or {}
    if groups:
        lines.append(f"key groups ({status.get('max_parallelism', '?')}) per instance: "
                     + "; ".join(f"{stage} {' '.join(ranges)}" for stage, ranges in groups.items()))
    steps = status.get("steps") or {}
    if steps:
        dead = status.get("step_dead_letters") or {}
        repairs = any("out_of_order" in f for f in steps.values())
        rows = [["STEP", "ELEMENTS", "RATE", "DEAD LETTERS"] + (["OUT OF ORDER", "TOMBSTONES"] if repairs else [])]
        for name, figures in steps.items():
            rows.append([name, _count(figures.get("elements")),
                         _rate(figures, (before or {}).get("steps", {}).get(name) if before else None, seconds, lambda s: s.get("elements")),
                         dead.get(name, 0)]
                        + ([_count(figures["out_of_order"]), _count(figures.get("tombstones"))] if "out_of_order" in figures
                           else ["", ""] if repairs else []))
        lines.append(table(rows))
    return "\n".join(lines)
