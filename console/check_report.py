"""How ``--check`` results are shown: a readable summary, JSON, and JUnit XML for CI."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any, Mapping, Sequence

from blockwidth.policy.checks import Check, Status
from blockwidth.policy.text import shown


def counts(checks: Sequence[Check]) -> dict[str, int]:
    c = Counter(ch.status for ch in checks)
    return {s.value: c.get(s, 0) for s in Status}


def text(checks: Sequence[Check], meta: Mapping[str, Any]) -> str:
    """The report, a line per check; each line shown escaped (a detail quotes the profile's and
    the records' strings), so a newline in a file never starts a line of its own."""
    lines = [shown(f"blockwidth check: profile {meta['profile']}, device {meta['device']}, MLX {meta['mlx']}")]
    for c in checks:
        name = c.name
        if c.entry is not None and c.line and name.startswith(f"entry {c.entry}"):
            name = name.replace(f"entry {c.entry}", f"entry {c.entry} (line {c.line})", 1)
        lines.append(shown(f"  {c.status.value:<12} {name}: {c.detail}"))
    n = counts(checks)
    tally = ", ".join(f"{v} {k}" for k, v in n.items() if v or k in ("pass", "fail"))
    rule = []
    if n["warn"]:
        rule.append("warnings fail (--strict)" if meta["strict"] else "warnings allowed; --strict fails them")
    if n["inconclusive"]:
        rule.append("inconclusive allowed (--allow-inconclusive)" if meta["allow_inconclusive"]
                    else "inconclusive fails; --allow-inconclusive allows it")
    lines.append(f"{tally}: exit {meta['exit_code']}" + "".join(f"; {r}" for r in rule))
    return "\n".join(lines)


def json_doc(checks: Sequence[Check], meta: Mapping[str, Any]) -> dict[str, Any]:
    return {**meta, "counts": counts(checks), "checks": [c.to_dict() for c in checks]}


def junit(checks: Sequence[Check], meta: Mapping[str, Any]) -> bytes:
    """JUnit XML as CI systems read it: one testcase per check. A warning is a failure
    with --strict and a note otherwise; inconclusive is a failure unless allowed, then skipped.
    Every text is shown (policy.text): XML 1.0 cannot hold most control characters even as
    references, so a path or a detail holding one made a report no CI could parse."""
    strict, allow = meta["strict"], meta["allow_inconclusive"]
    suites = ET.Element("testsuites", name="blockwidth --check")
    suite = ET.SubElement(suites, "testsuite", name="blockwidth-check")
    props = ET.SubElement(suite, "properties")
    for key in ("profile", "device", "mlx", "strict", "allow_inconclusive", "measure", "exit_code"):
        ET.SubElement(props, "property", name=key, value=shown(meta.get(key)))
    failures = skipped = 0
    for c in checks:
        detail = shown(c.detail)
        case = ET.SubElement(suite, "testcase", classname=f"blockwidth.{c.category.value}", name=shown(c.name))
        if c.status is Status.FAIL or (c.status is Status.WARN and strict) or (
                c.status is Status.INCONCLUSIVE and not allow):
            failures += 1
            ET.SubElement(case, "failure", message=detail, type=c.status.value).text = detail
        elif c.status in (Status.SKIP, Status.INCONCLUSIVE):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{c.status.value}: {detail}")
        elif c.status is Status.WARN:
            ET.SubElement(case, "system-out").text = f"warning: {detail}"
        else:
            ET.SubElement(case, "system-out").text = detail
    for el in (suites, suite):
        el.set("tests", str(len(checks)))
        el.set("failures", str(failures))
        el.set("errors", "0")
    suite.set("skipped", str(skipped))
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def junit_input_error(problems: Sequence[str], meta: Mapping[str, Any]) -> bytes:
    """For exit 2: the input problems as one errored testcase, so CI shows why nothing ran."""
    suites = ET.Element("testsuites", name="blockwidth --check", tests="1", failures="0", errors="1")
    suite = ET.SubElement(suites, "testsuite", name="blockwidth-check", tests="1", failures="0",
                          errors="1", skipped="0")
    case = ET.SubElement(suite, "testcase", classname="blockwidth.input", name="input")
    ET.SubElement(case, "error", message=shown(problems[0]) if problems else "bad input",
                  type="usage").text = "\n".join(shown(p) for p in problems)
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"
