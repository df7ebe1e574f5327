"""Session records: one JSON file per A/B session, renderable as Markdown.

A record holds the host identity, the pair (paths and content fingerprints),
the prompt hash and token counts (or the workload and each request's), every raw
sample with its per-round diagnostics, each width's speed-up with its interval
and p-value and the seed they came from, and the decision with why. Writing one (and where
they go) is the console's ``console.records``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from blockwidth.policy import files, stats
from blockwidth.policy.commands import env_words, server_how, shell
from blockwidth.policy.profile import server_env_problems
from blockwidth.policy.text import shown, shown_block

RECORD_SCHEMA = 1


def _round_columns() -> tuple[str, ...]:
    # the decode loop's own names; imported here, not at the top, so that reading or building a
    # record loads no MLX (engine.session holds what does not run the model)
    from blockwidth.engine.decode import ROUND_COLUMNS

    return ROUND_COLUMNS


def _arm(arm, rounds: bool = True) -> dict[str, Any]:
    dr, er = arm.decode_range(), arm.e2e_range()
    return {
        "arm": arm.name, "width": arm.width, "verdict": arm.verdict.value, "why": arm.why,
        "decode_tok_s": dr.to_list() if dr else None,
        "e2e_tok_s": er.to_list() if er else None,
        "acceptance": arm.acceptance, "per_token_acceptance": arm.per_token_acceptance,
        "identity": arm.identity.to_dict() if arm.identity else None,
        "samples": [dict(run.summary(), rounds_detail=run.rounds_table()) if rounds else run.summary()
                    for run in arm.runs],
    }


def build(session, pair, host: dict, gate: dict | None = None, route: str = "engine") -> dict[str, Any]:
    """``route``: what was measured (the record's ``path`` key), ``engine`` (this engine's loop)
    or ``mlx-lm-server`` (the real mlx_lm.server, whose record engine.session.served completes)."""
    many = not session.single
    arms = []
    for arm in [session.classic, *session.arms]:
        # A workload's own arms hold one run per pass; the rounds are kept per request below.
        d = _arm(arm, rounds=not many)
        est = session.estimates.get(arm.width) if arm.width is not None else None
        d.update(est.to_dict() if est else {"ratio": None, "ratio_ci": None, "p_value": None,
                                            "p_method": None})
        if many and arm.width is not None:
            d["differs_on"] = session.differing_requests(arm.width)
        if arm.width is not None and hasattr(arm, "round_breakdown"):
            # a round by part against classic's step (the engine path: a served run has no rounds)
            d["round_breakdown"] = arm.round_breakdown(session.classic_step_ms())
        arms.append(d)
    stock = getattr(session, "stock", None)
    plan = getattr(session, "exact", None)
    c = session.config
    # A workload of one request is still a workload: its request (id, prompt, tokens) is
    # recorded, not the default prompt the session's config carries beside it. Its arms are the
    # session's own, whose rounds are kept above.
    listed = many or (c.workload is not None and bool(session.requests))
    requests = None
    if listed:
        requests = [{**r.to_dict(), "arms": [_arm(a, rounds=many) for a in [r.classic, *r.arms]],
                     "classic_stock": (_arm(r.stock, rounds=many) if getattr(r, "stock", None) is not None
                                       else None)}
                    for r in session.per_request]
    opening, closing = session.opening_closing()
    return {
        "schema": RECORD_SCHEMA,
        "kind": "ab-session",
        "path": route,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session.started_at)),
        "host": host,
        "gate": gate,
        "pair": {
            "target": str(pair.target_path), "drafter": str(pair.drafter_path) if pair.drafter_path else None,
            "drafter_kind": pair.kind.value, "fingerprints": dict(pair.fingerprints),
            "pair_id": pair.pair_id, "target_quantization": pair.quantization.to_dict(),
            "target_dtypes": dict(getattr(pair, "target_dtypes", None) or {}) or None,
            "target_caches": pair.caches.summary() if getattr(pair, "caches", None) else None,
        },
        "prompt": {"sha256": session.prompt_sha256,
                   "tokens": sum(len(r.prepared.ids) for r in session.requests) if listed
                   else len(session.prompt_ids),
                   "text_head": (session.requests[0].prepared.request.head(200) if listed
                                 else session.config.prompt[:200])},
        "workload": c.workload.to_dict() if c.workload is not None else None,
        "requests": requests,
        "stats": {"seed": session.seed, "resamples": c.resamples, "level": stats.LEVEL,
                  "min_gain": c.min_gain, "alpha": stats.ALPHA, "sample": "per request, each run's new tokens and decode_s",
                  "ratio": "total new tokens over total decode time, the arm's over classic's",
                  "interval": "percentile bootstrap: requests with replacement, then each arm's "
                              "runs within each drawn request",
                  "p_value": "one-sided Mann-Whitney permutation test of the arm's passes against "
                             "classic's (a pass: one run of every request)"},
        "config": {"widths": list(session.config.widths), "n": session.config.n,
                   "max_tokens": session.config.max_tokens, "sequential": session.config.sequential,
                   "max_reps": session.config.max_reps, "max_seconds": session.config.max_seconds,
                   "verify_attention": session.config.verify_attention,
                   "verify_linear": session.config.verify_linear,
                   "auto_max": session.config.auto_cap},
        "verify_attention": session.attention,
        "warmup_shift": session.warmup_shift,
        "replayed_arms": {k: round(v, 2) for k, v in session.replayed_arms().items()},
        "order": session.order,
        "warmup": {name: run.summary() for name, run in session.warmup.items()},
        "cold_arms": {k: round(v, 2) for k, v in session.cold_arms().items()},
        "verify_overhead": {k: round(v, 2) for k, v in session.verify_overhead().items()},
        "warnings": session.warnings(),
        "reps": session.reps,
        "elapsed_s": round(session.elapsed_s, 3),
        "cancelled": session.cancelled,
        "arms": arms,
        "rounds_columns": list(_round_columns()),  # what each samples[].rounds_detail row holds
        "classes": {g: {"requests": list(ids), "widths": {str(w): e.to_dict() for w, e in est.items()}}
                    for g, (ids, est) in session.by_class.items()},
        "drift": {"drifted": session.drift, "why": session.drift_why,
                  "opening_tok_s": opening.to_list() if opening else None,
                  "closing_tok_s": closing.to_list() if closing else None},
        "exactness": {str(k): v.to_dict() for k, v in session.exactness.items()},
        # The exact path (engine.exact): whether every 1..16-row forward, classic's included, took
        # row-invariant kernels, and why; with it on, classic on stock kernels ran beside it and
        # the speed-ups are against the faster of the two (``baseline``).
        "exact": plan.to_dict() if plan is not None else None,
        "classic_stock": _arm(stock, rounds=not many) if stock is not None else None,
        "baseline": getattr(session, "baseline", "classic"),
        "costcurve": session.curve.to_dict() if session.curve else None,
        "costcurve_skipped": session.curve_skipped or None,
        "rollback": session.rollback_line() or None,
        "predicted_speedup": {str(k): round(v, 4) for k, v in session.predicted.items()},
        "predicted_best": session.predicted_best,
        "predicted_note": session.predicted_note,
        "prediction": {"draft_cost": session.draft_cost.value, "draft_cost_ms": round(session.draft_cost_ms, 4),
                       "drafter_kind": session.drafter_kind,
                       "widths": [p.to_dict() for _, p in sorted(session.prediction.items())]},
        "decision": {"recommendation": session.recommendation, "decision": session.decision,
                     "why": session.why, "saveable": session.saveable,
                     "best": session.choice.best if session.choice else None},
        "auto": auto_section(session),
    }


def auto_section(session) -> dict[str, Any] | None:
    """The auto arm's controller as it stood after the session (its costs, parameters and the
    curve they were measured from; each run's sample keeps its start state, widths, probes and
    switches), how to replay a run (engine.auto.replay(costs, params, start, rounds_detail)),
    and on a workload its shares of the per-request oracle and of the best fixed arm."""
    c = getattr(session, "auto", None)
    if c is None:
        return None
    out = {**c.to_dict(), "replay": "blockwidth.engine.auto.replay(costs, params, sample.auto.start, "
                                    "sample.rounds_detail) gives sample.widths"}
    shares = getattr(session, "oracle", None)
    out["oracle"] = shares.to_dict() if shares is not None else None
    return out


def stats_samples(record: dict) -> tuple[list, dict[int, list]]:
    """(classic, {width: ...}) per request, each run's (new tokens, decode seconds), read back
    from a record: what its statistics were computed from."""
    per_request = record.get("requests") or [{"arms": record["arms"],
                                               "classic_stock": record.get("classic_stock")}]
    arms: dict[int | None, list] = {}
    for req in per_request:
        for a in req["arms"]:
            arms.setdefault(a["width"], []).append([(s["tokens"], s["decode_s"]) for s in a["samples"]])
    classic = arms.pop(None)
    if record.get("baseline") == "classic-stock":  # the faster classic was the control
        classic = [[(s["tokens"], s["decode_s"]) for s in req["classic_stock"]["samples"]]
                   for req in per_request]
    return classic, {w: got for w, got in arms.items() if all(got)}


def reproduce(record: dict) -> dict[int, stats.Estimate]:
    """Every width's estimate recomputed from the record's own samples and seed."""
    st = record["stats"]
    classic, arms = stats_samples(record)
    return stats.estimates(classic, arms, seed=st["seed"], resamples=st["resamples"], level=st["level"])


def reproduce_oracle(record: dict):
    """The auto arm's shares of the oracle and the best fixed arm (policy.oracle.Shares),
    recomputed from the record's own samples and seed; None when it swept no auto arm."""
    from blockwidth.policy import oracle

    got = (record.get("auto") or {}).get("oracle")
    if not got:
        return None
    classic, arms = stats_samples(record)
    return oracle.shares({None: classic, **arms}, "auto", seed=got["seed"], resamples=got["resamples"],
                         level=record["stats"]["level"])


def load(path: Path) -> dict:
    """A record, read bounded and strict (files.FileProblem, a ValueError, when it cannot be)."""
    return files.read_json(Path(path), files.MAX_RECORD_BYTES)


def refusal(record: dict):
    """Why a stored session cannot be saved (a ``policy.verdict.RefusalKind``), or None: the
    rule ``decision.saveable`` was written with, read from the record's own verdicts, so a
    record written before that rule was one reads as its session would today."""
    from blockwidth.policy.verdict import Verdict, refusal as why_not, verdict_of

    def get(d, k):
        return d.get(k) if isinstance(d, dict) else None

    arms = record.get("arms") if isinstance(record.get("arms"), list) else []
    verdicts = [verdict_of(get(a, "verdict")) for a in arms]
    drift = get(record, "drift")
    rec = get(get(record, "decision"), "recommendation")
    return why_not(cancelled=bool(get(record, "cancelled")), drifted=bool(get(drift, "drifted")),
                   recommendation=rec if isinstance(rec, int) or rec == "auto" else None,
                   verdicts=[v for v in verdicts if v not in (None, Verdict.CONTROL)])


def _r(v: list | None) -> str:
    return "-" if not v else f"{v[0]:.1f} / {v[1]:.1f} / {v[2]:.1f}"


def _quantization(q: dict) -> str:
    """The target's quantization in the words the console and sweep use (``unquantized
    bfloat16``, ``affine 4-bit g64``); a scheme this version does not know, as stored."""
    from blockwidth.policy.quantization import Quantization

    try:
        return Quantization.from_dict(q).describe()
    except (KeyError, ValueError):
        return str(q.get("scheme"))


def _runs_in_order(record: dict):
    """(1-based run number, arm, its sample) for every measured run in the order it ran (each
    arm's samples are stored in their own order); the sample is None past an arm's last."""
    runs = {a["arm"]: iter(a["samples"]) for a in record["arms"]}
    for i, name in enumerate(record.get("order", []), 1):
        yield i, name, next(runs.get(name, iter(())), None)


def _clock_lines(record: dict) -> list[str]:
    """Every measured run in the order it ran, with the GPU's SM clock read before and after it,
    where the session read clocks (NVIDIA): whether a fast or slow run met another clock."""
    rows = []
    for i, name, sample in _runs_in_order(record):
        clocks = (sample or {}).get("gpu_clocks")
        if not clocks:
            continue
        mhz = [str((clocks.get(k) or {}).get("sm_mhz", "-")) for k in ("before", "after")]
        rows.append(f"| {i} | {name} | {sample['decode_tok_s']:.1f} | {' / '.join(mhz)} |")
    if not rows:
        return []
    return ["\n| run | arm | decode tok/s | SM MHz before / after |\n|---|---|---|---|", *rows]


def _host_lines(record: dict) -> list[str]:
    """Every measured run in the order it ran with the host's share of it: the main thread's CPU
    time against the wall clock, the host's stolen time and the involuntary context switches,
    and the CPU it ran on: whether a slow run's host worked longer, waited or moved."""
    rows = []
    for i, name, sample in _runs_in_order(record):
        h = (sample or {}).get("host_cpu")
        if not h:
            continue
        steal = "-" if h.get("steal_s") is None else f"{h['steal_s'] * 1e3:.0f}"
        cpus = " / ".join("-" if h.get(k) is None else str(h[k]) for k in ("cpu_before", "cpu_after"))
        rows.append(f"| {i} | {name} | {sample['decode_tok_s']:.1f} | {h['thread_cpu_s'] * 1e3:.0f} / "
                    f"{h['wall_s'] * 1e3:.0f} | {steal} | {h['involuntary_switches']} | {cpus} |")
    if not rows:
        return []
    return ["\n| run | arm | decode tok/s | main thread CPU / wall, ms | stolen, ms | involuntary "
            "switches | CPU before / after |\n|---|---|---|---|---|---|---|", *rows]


def _speedup_lines(record: dict) -> list[str]:
    """Each width's speed-up, interval and p-value, with the seed that reproduces them."""
    st = record.get("stats")
    rows = [a for a in record["arms"] if a.get("ratio") is not None]
    if not st or not rows:
        return []
    out = [f"\nSpeed-up over classic (total new tokens / total decode time), {st['level']:.0%} bootstrap "
           f"interval ({st['resamples']} resamples, seed {st['seed']}), one-sided permutation p; a win "
           f"needs the interval above {1 + st['min_gain']:.2f}"
           + (f" and p below {st['alpha']:g}" if st.get("alpha") is not None else "") + ".\n",
           "| width | speed-up | interval | p |", "|---|---|---|---|"]
    out += [f"| {a['arm']} | {a['ratio']:.3f} | {a['ratio_ci'][0]:.3f}-{a['ratio_ci'][1]:.3f} | "
            f"{a['p_value']:.3g} ({a['p_method']}) |" for a in rows]
    return out


def _request_lines(record: dict) -> list[str]:
    """A workload's requests: tokens, classic's median tok/s, each width's speed-up, the best."""
    reqs = record.get("requests")
    if not reqs:
        return []
    widths = [a["arm"] for a in reqs[0]["arms"] if a["width"] is not None]
    wl = record.get("workload") or {}
    out = [f"\nWorkload `{wl.get('name')}` ({wl.get('requests')} requests, sha256 `{str(wl.get('sha256'))[:16]}`):\n",
           "| request | kind | prompt tokens | classic tok/s (median) | " + " | ".join(widths) + " | best |",
           "|---|---|---|---|" + "---|" * len(widths) + "---|"]
    for r in reqs:
        c = r["arms"][0]["decode_tok_s"]
        cells = [("-" if r["ratios"].get(w) is None else f"{r['ratios'][w]:.2f}") for w in widths]
        # a request no width ran on (a cancelled session) has no best: not "classic"
        ran = r.get("measured", all(a.get("samples") for a in r["arms"]))
        best = f"w{r['best']}" if r.get("best") else "classic" if ran else "-"
        # a request id is any printable text: its "|" escaped, or the row gains a column
        rid = str(r["id"]).replace("|", "\\|")
        out.append(f"| {rid} | {r['kind']} | {r['prompt_tokens']} | {f'{c[1]:.1f}' if c else '-'} | "
                   + " | ".join(cells) + f" | {best} |")
    return out


def _path_line(record: dict) -> str:
    """What was measured: this engine's loop, or mlx_lm.server with its version and arguments."""
    path = record.get("path", "engine")
    if path == "engine":
        return "engine (blockwidth's decode loop)"
    server = record.get("server") or {}
    # a record is input when it is read back: its words shown (one line each), then quoted
    raw = server.get("args") if isinstance(server.get("args"), list) else []
    args = shell([shown(a) for a in raw])
    how = server_how(server.get("exact") is True, server.get("verify_attention"))
    env = server.get("env") or {}
    env = {k: v for k, v in env.items() if not server_env_problems({k: v})} if isinstance(env, dict) else {}
    env = ", environment " + env_words(env) if env else ""
    return (f"{path}: mlx_lm.server {server.get('mlx_lm')} ({how}{', ' + args if args else ''}{env}), "
            f"concurrency {record.get('concurrency', 1)}")


def _group_line(g: dict) -> str:
    """The group a sharded target ran on, as its record names it."""
    from blockwidth.policy.device import GroupSpecError, group_from_dict

    try:
        head = group_from_dict({k: g[k] for k in ("backend", "sharding", "size", "members") if k in g}).describe()
    except (GroupSpecError, KeyError, TypeError, ValueError):
        head = f"{g.get('size')} ranks over {g.get('backend')}, {g.get('sharding')}-sharded"
    agree = g.get("agreement") or {}
    return (f"{head}; drafter {g.get('drafter')}; launched by {g.get('launcher')}; ranks agreed on "
            f"{agree.get('runs_compared')} runs (compared every {agree.get('every')})")


def markdown(record: dict) -> str:
    host, pair, dec = record["host"], record["pair"], record["decision"]
    dev = host.get("device", {})
    lines = [
        f"# A/B session {record['created']}",
        "",
        f"- host: {dev.get('backend')} {dev.get('architecture') or ''} {dev.get('name') or ''}, "
        f"MLX {host.get('mlx')}, mlx-lm {host.get('mlx_lm')}, kernel {host.get('kernel')}",
        f"- pair: `{pair['target']}` [{_quantization(pair['target_quantization'])}] + "
        f"`{pair['drafter'] or 'lookup'}` ({pair['drafter_kind']}), id `{pair['pair_id']}`",
        f"- prompt: sha256 `{record['prompt']['sha256'][:16]}`, {record['prompt']['tokens']} tokens; "
        f"{record['config']['max_tokens']} new tokens; n = {record['config']['n']}, reps run {record['reps']}",
        f"- verify attention: {record.get('verify_attention') or 'fused'}",
        f"- path: {_path_line(record)}",
    ]
    if record.get("group"):  # a sharded target's group (engine.distributed)
        lines.append(f"- group: {_group_line(record['group'])}")
    from blockwidth.engine.linear import named

    lin = named(record.get("config", {}).get("verify_linear"))
    if lin:  # as sweep's header: named only when not stock
        lines.append(f"- verify linear: {lin}")
    lines += [
        "",
        "| arm | decode tok/s min / med / max | e2e tok/s min / med / max | acceptance | identity | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for a in record["arms"]:
        acc = f"{a['acceptance']:.3f}" if a["acceptance"] is not None else "-"
        ident = "-" if a["identity"] is None else ("identical" if a["identity"]["identical_ids"]
                                                   else f"differs @ {a['identity']['first_divergence']}")
        lines.append(f"| {a['arm']} | {_r(a['decode_tok_s'])} | {_r(a['e2e_tok_s'])} | {acc} | {ident} | "
                     f"{a['verdict']} |")
    lines += _speedup_lines(record)
    lines += _request_lines(record)
    lines += ["", f"**Decision:** {dec['decision']} — {dec['why']}"]
    if record["drift"]["drifted"]:
        lines.append(f"\n**Drift:** {record['drift']['why']}")
    if record.get("warnings"):  # what sweep and the console print beside the table
        lines.append("\n**Warnings:**\n")
        lines += [f"- {w}" for w in record["warnings"]]
    note = record.get("predicted_note") if isinstance(record.get("predicted_note"), str) else ""
    if record.get("predicted_best") or note:
        from blockwidth.engine.costcurve import prediction_words

        # the front ends' words: its best width (or that none is predicted faster), or why unresolved
        words = prediction_words(record.get("predicted_best"), {
            int(k): v for k, v in (record.get("predicted_speedup") or {}).items()}, note)
        lines.append(f"\n{words[:1].upper()}{words[1:]}")
    if record.get("predicted_best") or record.get("predicted_note"):
        # the terms behind the prediction, resolved or not: a reader checks a best width against them
        pred = record.get("prediction") or {}
        if pred.get("widths"):
            unit = "per round, any width" if pred["draft_cost"] == "flat" else "per drafted token"
            lines.append(f"({pred['drafter_kind']} drafting is {pred['draft_cost']}, "
                         f"{pred['draft_cost_ms']} ms {unit})\n\n| width | speed-up | tokens/round | draft ms | "
                         f"verify ms | rounds undrafted |\n|---|---|---|---|---|---|")
            lines += [f"| {p['width']} | {p['speedup']} | {p['tokens_per_round']} | {p['draft_ms']} | "
                      f"{p['verify_ms']} | {p.get('declined', 0.0):.0%} |" for p in pred["widths"]]
    lines += _clock_lines(record)
    lines += _host_lines(record)
    ex = record.get("exact")
    if ex:
        lines.append(f"\nExact path: {ex['reason']}"
                     + (f"; speed-ups against {record.get('baseline')}" if ex.get("active") else ""))
        if record.get("classic_stock"):
            cs, c = record["classic_stock"], record["arms"][0]
            lines.append(f"classic on the exact path {_r(c['decode_tok_s'])} tok/s, classic on stock kernels "
                         f"{_r(cs['decode_tok_s'])} tok/s (decode, min/median/max)")
    if record.get("exactness"):
        lines.append("\n| width | bitwise equal | max abs diff | argmax agreement |\n|---|---|---|---|")
        for k, e in record["exactness"].items():
            agree = sum(e["argmax_agree"])
            lines.append(f"| {k} | {e['bitwise_equal']} | {e['max_abs_diff']:.3g} | {agree}/{len(e['argmax_agree'])} |")
    # a record names folders and quotes a prompt: the file and the console get them escaped
    return shown_block("\n".join(lines)) + "\n"
