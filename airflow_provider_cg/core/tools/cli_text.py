"""What ``cg`` prints: each answer as text (tables, a group described, status, lag, the plans
of a reset or a resize) or, with ``--json``, as JSON (``emit``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from airflow_provider_cg.core.groups import layouts, partitioning, problems
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.config import ElasticGroupConfig

if TYPE_CHECKING:
    import argparse

    from airflow_provider_cg.core.groups.config import GroupConfig
    from airflow_provider_cg.core.groups.lag import GroupLag
    from airflow_provider_cg.core.groups.reset_plan import ResetPlan
    from airflow_provider_cg.core.groups.resize import ResizePlan
    from airflow_provider_cg.core.groups.status import GroupStatus, MemberState
    from airflow_provider_cg.core.groups.store import GroupInfo
    from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import LastCommit


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table (no trailing spaces)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def ranges(parts: Sequence[int]) -> str:
    """``[0,1,2,5]`` -> ``"0-2,5"``; empty -> ``"-"``."""
    ps = sorted(parts)
    if not ps:
        return "-"
    out, start, prev = [], ps[0], ps[0]
    for p in [*ps[1:], None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if p is not None:
            start = prev = p
    return ",".join(out)


def emit(args: argparse.Namespace, data: Any, text: str, out: TextIO) -> None:
    if getattr(args, "json", False):
        out.write(json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")
    else:
        out.write(text.rstrip("\n") + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, tuple | set):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def membership_text(cfg: GroupConfig) -> str:
    if cfg.member_mappings:
        return "mappings " + ", ".join(f"{m.member}:{ranges(m.partitions)}" for m in cfg.member_mappings)
    return "members " + (", ".join(cfg.members) or "none")


def describe(info: GroupInfo, states: list[MemberState] | None = None) -> str:
    cfg = info.config
    lines = [f"group:        {info.group} on stream {info.stream} ({info.kind}, revision {info.revision})",
             f"max members:  {cfg.max_members} (partitions)"]
    if isinstance(cfg, ElasticGroupConfig):  # the elastic kind's config
        fl = [f"{pf.filter} (wildcards {','.join(map(str, pf.partitioning_wildcards)) or 'none: whole subject'})"
              for pf in cfg.partitioning_filters]
        lines.append(f"filters:      {'; '.join(fl) or '> (whole subject)'}")
        lines.append(f"buffer:       max msgs {cfg.max_buffered_msgs or 'unlimited'}, "
                     f"max bytes {cfg.max_buffered_bytes or 'unlimited'}")
        lines.append(f"work queue:   {groupnames.work_queue_stream(info.stream, info.group)}")
    else:
        lines.append(f"filters:      {', '.join(cfg.filters) or '> (all)'}")
    if cfg.member_mappings:
        lines.append("mappings:     " + "; ".join(f"{m.member}={ranges(m.partitions)}" for m in cfg.member_mappings))
    else:
        lines.append(f"members:      {', '.join(cfg.members) or '(none)'}")
    assignment = partitioning.assign_partitions(cfg)
    if states is not None:
        rows = [(s.member, ranges(s.partitions), "yes" if s.consumer_exists else "no", s.pinned_id or "-")
                for s in states]
        lines += ["", table(["MEMBER", "PARTITIONS", "ACTIVE", "PINNED"], rows)]
    elif assignment:
        lines += ["", table(["MEMBER", "PARTITIONS"], [(m, ranges(p)) for m, p in assignment.items()])]
    return "\n".join(lines)


def members_table(states: list[MemberState]) -> str:
    rows = [
        (s.member, ranges(s.partitions), "yes" if s.consumer_exists else "no",
         ("" if s.filters_current else "stale ") + (s.pinned_id or "-"), s.num_pending, s.num_ack_pending,
         s.num_redelivered, s.num_waiting)
        for s in states
    ]
    return table(["MEMBER", "PARTITIONS", "CONSUMER", "PINNED", "PENDING", "ACK_PENDING", "REDELIVERED", "WAITING"],
                 rows)


def _stopped_text(stopped: dict | None) -> list[str]:
    if not stopped:
        return []
    what = (f"a resize to {stopped.get('max_members')} partitions" if stopped.get("op") == "resize"
            else f"a reset ({stopped.get('target')})")
    return [f"sourcing:     STOPPED after origin sequence {stopped['cut']} by {what} that has not finished: run it "
            "again (--execute) to finish it"]


def _health_text(source_stalled: str | None, found: dict) -> list[str]:
    """What is wrong beyond the backlog: a stalled source, what the jobs found."""
    lines = []
    if source_stalled:
        lines.append(f"SOURCE STALLED: {source_stalled}; the group's member jobs start it again")
    lines += [problems.describe(kind, what) for kind, what in sorted(found.items())]
    return lines


def status_text(st: GroupStatus, lag: GroupLag | None = None) -> str:
    layout = f", layout {st.layout}" if st.kind == groupnames.ELASTIC else ""
    lines = [f"group:        {st.group} on stream {st.stream} ({st.kind}, revision {st.revision}{layout})",
             f"backlog:      {st.backlog}  pending {st.num_pending}  ack pending {st.num_ack_pending}  "
             f"redelivered {st.num_redelivered}"
             + (f"  oldest pending {_age(lag.oldest_pending_age_s)}" if lag is not None else "")]
    lines += _stopped_text(st.sourcing_stopped)
    lines += _health_text(st.source_stalled, st.problems)
    if st.kind == groupnames.ELASTIC:
        fill = st.buffer_fill
        lines.append(f"buffer:       {st.buffered_msgs} msgs / {st.buffered_bytes} bytes"
                     + (f" ({fill:.0%} full)" if fill is not None else "")
                     + (f", source lag {st.source_lag}" if st.source_lag is not None else ""))
    for p, why in sorted(st.partition_problems.items()):  # its backlog is unknown: say so
        lines.append(f"NOT CURRENT:  partition {p}'s stream {layouts.named(st.layout).partition_store(work_queue_of(st), p)}: "
                     f"{why}")
    if st.inactive_members:
        lines.append(f"no consumer:  {', '.join(st.inactive_members)}")
    if st.unassigned_partitions:
        lines.append(f"unassigned:   partitions {ranges(st.unassigned_partitions)}")
    owner = {p: m.member for m in st.members for p in m.partitions}
    label = "BACKLOG" if st.kind == groupnames.ELASTIC else "STORED"
    lines += ["", table(["PARTITION", "MEMBER", label], [(p, owner.get(p, "-"), n) for p, n in sorted(st.partitions.items())])]
    if st.members:
        lines += ["", members_table(st.members)]
    return "\n".join(lines)


def work_queue_of(st: GroupStatus) -> str:
    return groupnames.work_queue_stream(st.stream, st.group)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def life_text(stream: str, life: dict | None) -> str:
    if life is None:
        return ""
    went = life.get("went_back")
    if went:
        return "\n" + problems.describe(problems.ORIGIN_WENT_BACK, went)
    if life["key"]:
        return f"\norigin:       {stream} created {life['created']}, lands as {life['key']}"
    if life["known"]:
        return f"\norigin:       {stream} created {life['created']}, not landed here yet"
    return (f"\norigin:       {stream} created {life['created']}: ANOTHER LIFE than the table holds (created "
            f"{', '.join(x['created'] for x in life['lives'])}); its jobs refuse until "
            f"--stream-life new:{life['created']} (here or on the jobs)")


def _commit_text(c: LastCommit | None) -> str:
    if c is None:
        return "-"
    seqs = ", ".join(f"{r['first_seq']}-{r['last_seq']}" for r in c.origin.values()) or "-"
    return f"{c.committed_at[:19].replace('T', ' ')} {c.rows_written} rows, seq {seqs}"


def lag_text(lag: GroupLag, commits: dict | None = None) -> str:
    lines = [f"group:        {lag.group} on stream {lag.stream} ({lag.kind})",
             f"backlog:      {lag.backlog}  oldest pending {_age(lag.oldest_pending_age_s)}"
             + (f"  source lag {lag.source_lag}" if lag.source_lag is not None else "")]
    lines += _stopped_text(lag.sourcing_stopped)
    lines += _health_text(lag.source_stalled, lag.problems)
    for p, why in sorted(lag.partition_problems.items(), key=lambda kv: int(kv[0])):
        lines.append(f"NOT CURRENT:  partition {p}'s stream: {why} (its backlog is not known)")
    if lag.unassigned_partitions:
        lines.append(f"unassigned:   partitions {ranges(lag.unassigned_partitions)}")
    rows: list[tuple[Any, ...]] = [(m.member, ranges(m.partitions), m.backlog, m.num_ack_pending, _age(m.oldest_pending_age_s),
             m.pin_holder or "-", m.pinned_since or "-") for m in lag.members]
    headers = ["MEMBER", "PARTITIONS", "BACKLOG", "IN_FLIGHT", "OLDEST_PENDING", "PINNED", "SINCE"]
    if commits is not None:
        headers.append("LAST_COMMIT (UTC)")
        rows = [(*r, _commit_text(commits.get(m.member))) for r, m in zip(rows, lag.members, strict=True)]
    if rows:
        lines += ["", table(headers, rows)]
    return "\n".join(lines)


def resize_text(plan: ResizePlan) -> str:
    members = sorted(set(plan.partitions) | set(plan.new_partitions))
    rows = [(m, ranges(plan.partitions.get(m, [])) or "-", ranges(plan.new_partitions.get(m, [])) or "-")
            for m in members]
    lines = [f"resize of elastic group {plan.group} on stream {plan.stream}: {plan.max_members} -> "
             f"{plan.new_max_members} partitions", "",
             table(["MEMBER", "PARTITIONS", "NEW_PARTITIONS"], rows), ""]
    if plan.state == "done":
        lines.append(f"done: sourcing stopped after origin sequence {plan.cut}, the old partitions drained, the "
                     "group switched and sourcing resumed with the new partitions")
    else:
        lines += [f"{plan.backlog} message(s) in the work queue land in the old partitions first"
                  + (f" (sourcing stopped after origin sequence {plan.cut})" if plan.in_progress else ""),
                  "dry run: nothing changed (--execute stops sourcing, waits for the members' jobs to drain the "
                  "work queue, switches, resumes)"]
    return "\n".join(lines)


def reset_text(plan: ResetPlan) -> str:
    who = f"member {plan.member}" if plan.member else "every member"
    rows = [(c.member, ranges(c.partitions), c.current, c.new, c.replay, c.skip) for c in plan.changes]
    lines = [f"reset {plan.target} of {who} of {plan.kind} group {plan.group} on stream {plan.stream} "
             f"(origin sequences {plan.origin_first_seq}..{plan.origin_last_seq})", "",
             table(["MEMBER", "PARTITIONS", "POSITION", "NEW_POSITION", "REPLAY", "SKIP"], rows) if rows
             else "no partitions", "",
             f"{plan.replay} message(s) will be read again (sinks drop those they hold), {plan.skip} skipped"]
    if plan.executed:
        lines.append("done: the positions were moved")
    else:
        if plan.pinned:
            lines.append("running (pinned): " + ", ".join(sorted(plan.pinned)) + " -- --execute refuses unless "
                         "--force (steps them down)")
        lines.append("dry run: nothing changed (--execute applies it)")
    return "\n".join(lines)
