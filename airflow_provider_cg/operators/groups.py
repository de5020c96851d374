"""Consumer-group administration operators (create/delete, membership, step-down, status).

Each operator opens one NATS connection through :class:`NatsHook` (``nats_conn_id``), calls
:class:`~airflow_provider_cg.core.groups.admin.ConsumerGroups` and returns a JSON-able dict to XCom.
Invalid input raises ``ConfigError(field, rule)`` when the DAG is parsed (values that are
Jinja templates are checked after rendering, still before the server is contacted); a
config the server refuses (a different immutable field, a missing group, ...) fails the
task without retries (``AirflowFailException``, message ``"<field>: <rule>"``).

Create and the membership operators are idempotent: running them again with the same
arguments changes nothing (``created`` / ``changed`` are ``False`` in the result).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_cg.core.errors import ConfigError, GroupNotFound, JetStreamApiError
from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import (
    ElasticGroupConfig,
    GroupConfig,
    StaticGroupConfig,
)
from airflow_provider_cg.core.groups.layouts import LayoutError
from airflow_provider_cg.core.groups.layouts.partition_streams import check_replicas
from airflow_provider_cg.core.groups.membership import check_assignment, parse_mappings, parse_members
from airflow_provider_cg.core.groups.store import ELASTIC, KINDS, STATIC, GroupInfo
from airflow_provider_cg.core.jetstream.api import ERR_STREAM_NAME_IN_USE, ERR_STREAM_NOT_FOUND, JsApi
from airflow_provider_cg.hooks.nats import NatsHook
from airflow_provider_cg.lineage import MovesNoData
from airflow_provider_cg.operators.group_arguments import (
    TRANSFORM_FUNCTION,
    literal,
    partitioning_filters,
    templated,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from airflow_provider_cg.core.groups.lag import GroupLag
    from airflow_provider_cg.core.groups.reset_plan import ResetTarget
    from airflow_provider_cg.core.groups.status import GroupStatus

__all__ = [
    "CreateConsumerGroupOperator",
    "DeleteConsumerGroupOperator",
    "AddMembersOperator",
    "DropMembersOperator",
    "SetMemberMappingsOperator",
    "DeleteMemberMappingsOperator",
    "StepDownMemberOperator",
    "ResetConsumerGroupOperator",
    "ResizeConsumerGroupOperator",
    "MoveConsumerGroupLayoutOperator",
    "ConsumerGroupStatusOperator",
]

T = TypeVar("T")
UI_COLOR = "#cfe2f3"


class _ConsumerGroupOperator(MovesNoData, BaseOperator):
    """Shared by the operators: stream/group names, the connection, error mapping."""

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id")
    ui_color = UI_COLOR

    def __init__(self, *, stream: str, group: str, nats_conn_id: str = NatsHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.group = group
        self.nats_conn_id = nats_conn_id
        for field in ("stream", "group"):
            if not templated(getattr(self, field)):
                groupnames.validate_name(field, getattr(self, field), field)

    def _validate(self) -> None:
        """Checks after rendering, before any connection (raise ``ConfigError``)."""
        groupnames.validate_name("stream", self.stream, "stream")
        groupnames.validate_name("group", self.group, "group")

    @cached_property
    def hook(self) -> NatsHook:
        return NatsHook(nats_conn_id=self.nats_conn_id)


    def _run(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Validate, then ``await fn(nc)`` on a fresh connection; config errors fail for good."""
        try:
            self._validate()
            return self.hook.run(fn)
        except (ConfigError, GroupNotFound) as e:
            raise AirflowFailException(str(e)) from e


class CreateConsumerGroupOperator(_ConsumerGroupOperator):
    """Create a consumer group; succeed without changes when it exists with the same config.

    :param stream: origin stream (must exist, unless ``create_stream`` creates it).
    :param group: group name.
    :param kind: ``"elastic"`` (default) or ``"static"``.
    :param max_members: number of partitions (1..1024).
    :param filters: static only: subject filters (after the partition token).
    :param partitioning_filters: elastic only: subjects (whole subject hashed) or
        ``{"filter": "orders.*.*", "partitioning_wildcards": [1]}``.
    :param max_buffered_msgs: elastic only: work-queue stream limit (0 = unlimited).
    :param max_buffered_bytes: elastic only: work-queue stream limit (0 = unlimited).
    :param members: member names, or
    :param member_mappings: ``{member: [partitions]}`` or ``[{"member", "partitions"}]``.
    :param layout: elastic only: ``"work-queue"`` (default, orbit's) or ``"partition-streams"`` (a
        stream per partition, so members do not read each other's messages; orbit instances cannot
        consume it; see ``MoveConsumerGroupLayoutOperator``).
    :param create_stream: create the origin stream first when it does not exist: a raw
        JetStream stream config, e.g. ``{"subjects": ["orders.>"], "storage": "memory"}``
        (``name`` defaults to ``stream``). An existing stream is left as it is.
    :param nats_conn_id: Airflow connection of type ``nats``.

    Every argument is templated. Rendered without ``render_template_as_native_obj``, a list,
    dict or number arrives as its text and is read back as a Python literal. Strings holding a
    subject-transform function (``{{partition(3,1)}}``, ``{{wildcard(1)}}``, ...) are not
    Jinja and are left as they are.

    Returns ``GroupInfo.to_dict()`` (kind, stream, group, revision, config, assignment) plus
    ``created`` and ``stream_created``. An existing group with a different immutable field
    fails naming the field; a different membership is kept (a warning says so: change it
    with the membership operators).
    """

    CONFIG_FIELDS = ("kind", "max_members", "filters", "partitioning_filters", "max_buffered_msgs",
                     "max_buffered_bytes", "members", "member_mappings", "create_stream", "layout")
    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id", *CONFIG_FIELDS)
    template_fields_renderers = {"create_stream": "json", "member_mappings": "json", "partitioning_filters": "json"}

    def __init__(
        self,
        *,
        stream: str,
        group: str,
        max_members: int | str,
        kind: str = ELASTIC,
        filters: Sequence[str] | None = None,
        partitioning_filters: Sequence[str | Mapping[str, Any]] | None = None,
        max_buffered_msgs: int = 0,
        max_buffered_bytes: int = 0,
        members: Sequence[str] | None = None,
        member_mappings: Any = None,
        create_stream: dict[str, Any] | None = None,
        layout: str = layouts.DEFAULT,
        nats_conn_id: str = NatsHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, group=group, nats_conn_id=nats_conn_id, **kwargs)
        self.kind = kind
        self.layout = layout
        self.max_members = max_members
        self.filters = filters
        self.partitioning_filters = partitioning_filters
        self.max_buffered_msgs = max_buffered_msgs
        self.max_buffered_bytes = max_buffered_bytes
        self.members = members
        self.member_mappings = member_mappings
        self.create_stream = create_stream
        if not any(templated(getattr(self, f)) for f in self.CONFIG_FIELDS):
            self.build_config()
        if not any(templated(v) for v in (stream, group, kind)):
            groupnames.validate_names(stream, group, kind)
        if not templated(create_stream):
            self._stream_config()

    def render_template(self, content: Any, context: Any, jinja_env: Any = None, seen_oids: Any = None) -> Any:
        if isinstance(content, str) and TRANSFORM_FUNCTION.search(content):
            return content  # a stream subject transform, not Jinja
        return super().render_template(content, context, jinja_env, seen_oids)

    def build_config(self) -> GroupConfig:
        """The validated group config from the operator's (rendered) arguments."""
        for field in self.CONFIG_FIELDS:
            setattr(self, field, literal(field, getattr(self, field)))
        if self.kind not in KINDS:
            raise ConfigError("kind", f"must be one of {', '.join(KINDS)}")
        layout = layouts.named(layouts.check("layout", self.layout))
        if self.kind == STATIC and layout.elastic_only:
            raise ConfigError("layout", "only for elastic groups (a static group's members read the origin)")
        for field in ("max_members", "max_buffered_msgs", "max_buffered_bytes"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(field, "must be an integer")
        members = tuple(parse_members("members", self.members)) if self.members else ()
        mappings = tuple(parse_mappings(self.member_mappings)) if self.member_mappings else ()
        if self.kind == STATIC:
            for field in ("partitioning_filters", "max_buffered_msgs", "max_buffered_bytes"):
                if getattr(self, field):
                    raise ConfigError(field, "only for elastic groups")
            filters = self.filters or ()
            if not isinstance(filters, list | tuple):
                raise ConfigError("filters", "must be a list of subjects")
            cfg: GroupConfig = StaticGroupConfig(cast(int, self.max_members), tuple(filters), members, mappings)
        else:
            if self.filters:
                raise ConfigError("filters", "only for static groups (elastic groups take partitioning_filters)")
            cfg = ElasticGroupConfig(
                cast(int, self.max_members),  # validated by the config
                partitioning_filters(self.partitioning_filters),
                self.max_buffered_msgs,
                self.max_buffered_bytes,
                members,
                mappings,
            )
        return cfg.validate()

    def _stream_config(self) -> dict[str, Any] | None:
        if self.create_stream is None:
            return None
        if not isinstance(self.create_stream, Mapping):
            raise ConfigError("create_stream", "must be a dict (a JetStream stream config)")
        sc = {"storage": "file", **{k: v if k == "name" else literal(f"create_stream.{k}", v)
                                    for k, v in self.create_stream.items()}}
        sc.setdefault("name", self.stream)
        if sc["name"] != self.stream:
            raise ConfigError("create_stream.name", "must be the group's stream (or left out)")
        subjects = sc.get("subjects")
        if not sc.get("sources") and not sc.get("mirror"):
            if not isinstance(subjects, list | tuple) or not subjects:
                raise ConfigError("create_stream.subjects", "give a list of subjects")
        if subjects is not None:
            for i, s in enumerate(subjects):
                groupnames.validate_subject(f"create_stream.subjects[{i}]", s)
            sc["subjects"] = list(subjects)
        if sc["storage"] not in ("file", "memory"):
            raise ConfigError("create_stream.storage", "must be 'file' or 'memory'")
        return sc

    def _validate(self) -> None:
        super()._validate()
        groupnames.validate_names(self.stream, self.group, self.kind)
        self.build_config()
        self._stream_config()

    def execute(self, context: Any) -> dict[str, Any]:
        async def go(nc: NATS) -> tuple[GroupInfo, bool]:
            stream_created = False
            sc = self._stream_config()
            if sc is not None:
                stream_created = await _ensure_stream(JsApi(nc), sc)
            cg = ConsumerGroups(nc)
            try:
                existing = await cg.get(self.stream, self.group)
            except GroupNotFound:
                existing = None
            if existing is not None and existing.kind != self.kind:
                raise ConfigError("kind", f"the group exists as a {existing.kind} group; cannot change after creation")
            return await cg.create(self.stream, self.group, self.build_config(), layout=self.layout), stream_created

        info, stream_created = self._run(go)
        if stream_created:
            self.log.info("Created stream %s", self.stream)
        if info.created:
            self.log.info("Created %s group %s on stream %s (revision %s)", info.kind, self.group, self.stream,
                          info.revision)
        else:
            self.log.info("Group %s on stream %s already exists with this config", self.group, self.stream)
            want = self.build_config()
            if (want.members, want.member_mappings) != (info.config.members, info.config.member_mappings):
                self.log.warning(
                    "The existing group's membership differs from the one given and was left unchanged; "
                    "use AddMembersOperator / SetMemberMappingsOperator to change it"
                )
        return {**info.to_dict(), "created": info.created, "stream_created": stream_created}


async def _ensure_stream(api: JsApi, config: dict[str, Any]) -> bool:
    """Create the stream unless it exists; True when this call created it."""
    try:
        await api.stream_info(config["name"])
        return False
    except JetStreamApiError as e:
        if e.err_code != ERR_STREAM_NOT_FOUND:
            raise
    try:
        await api.add_stream(config)
        return True
    except JetStreamApiError as e:
        if e.err_code == ERR_STREAM_NAME_IN_USE:
            return False  # created meanwhile by someone else
        raise


class DeleteConsumerGroupOperator(_ConsumerGroupOperator):
    """Delete a group: its config and its work-queue stream (elastic) or member consumers (static).

    The origin stream stays. ``ignore_missing`` (default) makes a missing group a success.
    Returns ``{"stream", "group", "kind", "deleted"}``.
    """

    def __init__(self, *, stream: str, group: str, ignore_missing: bool = True, **kwargs: Any) -> None:
        super().__init__(stream=stream, group=group, **kwargs)
        self.ignore_missing = ignore_missing

    def execute(self, context: Any) -> dict[str, Any]:
        async def go(nc: NATS) -> GroupInfo | None:
            try:
                return await ConsumerGroups(nc).delete(self.stream, self.group)
            except GroupNotFound:
                if not self.ignore_missing:
                    raise
                return None

        info = self._run(go)
        if info is None:
            self.log.info("Group %s on stream %s does not exist: nothing to delete", self.group, self.stream)
        else:
            self.log.info("Deleted %s group %s on stream %s", info.kind, self.group, self.stream)
        return {
            "stream": self.stream,
            "group": self.group,
            "kind": info.kind if info else None,
            "deleted": info is not None,
        }


class _MembershipOperator(_ConsumerGroupOperator):
    """One membership change of an elastic group (compare-and-set, then safe transition)."""

    action: ClassVar[str]

    def _change(self, cg: ConsumerGroups) -> Awaitable[GroupInfo]:  # pragma: no cover - abstract
        raise NotImplementedError

    def execute(self, context: Any) -> dict[str, Any]:
        async def go(nc: NATS) -> tuple[GroupInfo, GroupInfo]:
            cg = ConsumerGroups(nc)
            before = await cg.get(self.stream, self.group)
            return before, await self._change(cg)

        before, after = self._run(go)
        changed = after.revision != before.revision
        result = {**after.to_dict(), "changed": changed}
        if changed:
            self.log.info("%s on group %s: assignment now %s", self.action, self.group, result["assignment"])
        else:
            self.log.info("%s on group %s: nothing to change", self.action, self.group)
        return result


class _MembersOperator(_MembershipOperator):
    """A change that names members: a list, or one comma-separated string (templated).

    :param assignment: ``"block"`` (default: contiguous blocks, orbit's ``members``) or
        ``"sticky"`` (only the partitions that must move do; stored as ``member_mappings``).
    """

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id", "members", "assignment")

    def __init__(self, *, stream: str, group: str, members: Sequence[str] | str, assignment: str = "block",
                 **kwargs: Any) -> None:
        super().__init__(stream=stream, group=group, **kwargs)
        self.members, self.assignment = members, assignment
        if not templated(members):
            parse_members("members", members)
        if not templated(assignment):
            check_assignment(assignment)

    def _validate(self) -> None:
        super()._validate()
        parse_members("members", self.members)
        check_assignment(self.assignment)


class AddMembersOperator(_MembersOperator):
    """Add members to an elastic group; partitions move to them safely.

    Returns ``GroupInfo.to_dict()`` (with the new ``assignment``) plus ``changed``.
    """

    action = "add members"

    def _change(self, cg: ConsumerGroups) -> Awaitable[GroupInfo]:
        return cg.add_members(self.stream, self.group, parse_members("members", self.members),
                              assignment=self.assignment)


class DropMembersOperator(_MembersOperator):
    """Remove members from an elastic group; their partitions move to the others.

    Returns ``GroupInfo.to_dict()`` (with the new ``assignment``) plus ``changed``.
    """

    action = "drop members"

    def _change(self, cg: ConsumerGroups) -> Awaitable[GroupInfo]:
        return cg.drop_members(self.stream, self.group, parse_members("members", self.members),
                               assignment=self.assignment)


class SetMemberMappingsOperator(_MembershipOperator):
    """Replace an elastic group's membership with explicit member -> partitions mappings.

    ``mappings``: ``{"m1": [0, 1], "m2": [2]}``, ``[{"member": "m1", "partitions": [0, 1]}, ...]``
    or the same as JSON text; every partition must be mapped exactly once.
    """

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id", "mappings")
    action = "set member mappings"

    def __init__(self, *, stream: str, group: str, mappings: Any, **kwargs: Any) -> None:
        super().__init__(stream=stream, group=group, **kwargs)
        self.mappings = mappings
        if not templated(mappings):
            self._parsed()

    def _parsed(self) -> list:
        parsed = parse_mappings(self.mappings)
        if not parsed:
            raise ConfigError("member_mappings", "give at least one mapping")
        for i, m in enumerate(parsed):
            groupnames.validate_name(f"member_mappings[{i}].member", m.member, "member")
        return parsed

    def _validate(self) -> None:
        super()._validate()
        self._parsed()

    def _change(self, cg: ConsumerGroups) -> Awaitable[GroupInfo]:
        return cg.set_mappings(self.stream, self.group, self._parsed())


class DeleteMemberMappingsOperator(_MembershipOperator):
    """Remove an elastic group's member mappings (it has no members until some are added)."""

    action = "delete member mappings"

    def _change(self, cg: ConsumerGroups) -> Awaitable[GroupInfo]:
        return cg.delete_mappings(self.stream, self.group)


class StepDownMemberOperator(_ConsumerGroupOperator):
    """Unpin a member's active instance; the server pins one of its waiting instances.

    Fails when the member has no consumer (no instance ever ran). Returns ``{"stream",
    "group", "member", "unpinned_id"}`` (the pin id that was active, or ``None``).
    """

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id", "member")

    def __init__(self, *, stream: str, group: str, member: str, **kwargs: Any) -> None:
        super().__init__(stream=stream, group=group, **kwargs)
        self.member = member
        if not templated(member):
            groupnames.validate_name("member", member, "member")

    def _validate(self) -> None:
        super()._validate()
        groupnames.validate_name("member", self.member, "member")

    def execute(self, context: Any) -> dict[str, Any]:
        async def go(nc: NATS) -> str | None:
            cg = ConsumerGroups(nc)
            pinned = [s.pinned_id for s in await cg.member_info(self.stream, self.group) if s.member == self.member]
            await cg.step_down(self.stream, self.group, self.member)
            return pinned[0] if pinned else None

        unpinned = self._run(go)
        self.log.info("Member %s of group %s stepped down (pin %s released)", self.member, self.group, unpinned)
        return {"stream": self.stream, "group": self.group, "member": self.member, "unpinned_id": unpinned}


class ResetConsumerGroupOperator(_ConsumerGroupOperator):
    """Move a group's (or one member's) position, as ``cg reset`` does
    (``core/groups/reset.py``): give exactly one of ``to_datetime`` (ISO 8601), ``by_duration``
    (``15m``, ``1h30m``), ``to_earliest``, ``to_latest``, ``to_seq`` or ``shift_by``.

    A plan by default (``dry_run=True``: nothing changes; the task's XCom says per member and
    partition the position now and after, and the messages read again or skipped); with
    ``dry_run=False`` the plan is applied. Refused while an affected member has a pinned
    instance (the task fails and is retried as configured), unless ``force``, which steps them
    down first. Returns the plan (``executed`` says whether it was applied).
    """

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id", "member", "to_datetime", "by_duration",
                                      "to_seq", "shift_by")

    def __init__(self, *, stream: str, group: str, member: str | None = None, to_datetime: Any = None,
                 by_duration: Any = None, to_earliest: bool = False, to_latest: bool = False, to_seq: Any = None,
                 shift_by: Any = None, dry_run: bool = True, force: bool = False, **kwargs: Any) -> None:
        super().__init__(stream=stream, group=group, **kwargs)
        self.member, self.to_datetime, self.by_duration, self.to_earliest = member, to_datetime, by_duration, to_earliest
        self.to_latest, self.to_seq, self.shift_by = to_latest, to_seq, shift_by
        # not ``self.dry_run``: that is BaseOperator's method (``airflow tasks test --dry-run``)
        self.plan_only, self.force = dry_run, force
        if not any(templated(v) for v in (member, to_datetime, by_duration, to_seq, shift_by)):
            self._target()
        if member is not None and not templated(member):
            groupnames.validate_name("member", member, "member")

    def _target(self) -> ResetTarget:
        from airflow_provider_cg.core.groups.reset_plan import ResetTarget

        return ResetTarget.parse(to_datetime=self.to_datetime, by_duration=self.by_duration,
                                 to_earliest=self.to_earliest, to_latest=self.to_latest, to_seq=self.to_seq,
                                 shift_by=self.shift_by)

    def _validate(self) -> None:
        super()._validate()
        if self.member is not None:
            groupnames.validate_name("member", self.member, "member")
        self._target()

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_provider_cg.core.groups.reset import GroupReset

        async def go(nc: NATS) -> dict[str, Any]:
            resets = GroupReset(nc)
            plan = await resets.plan(self.stream, self.group, self._target(), self.member)
            if not self.plan_only:
                plan = await resets.execute(plan, force=self.force)
            return plan.to_dict()

        plan = self._run(go)
        self.log.info("Reset %s of %s: %d message(s) read again, %d skipped%s", plan["target"],
                      self.member or f"group {self.group}", plan["replay"], plan["skip"],
                      "" if plan["executed"] else " (dry run: nothing changed)")
        return plan


class MoveConsumerGroupLayoutOperator(_ConsumerGroupOperator):
    """Move an elastic group to another layout (``"work-queue"`` or ``"partition-streams"``), as
    ``cg layout`` does (``core/groups/moves.py``), with nothing lost, landed twice or out of
    per-key order while its members' jobs run. Either way the group's source moves at a cut and
    the task waits up to ``wait`` seconds for the members' jobs to land what the side it leaves
    holds (the work queue, state ``filling``; the partition log, state ``draining``; the jobs
    must run meanwhile); if they have not, the task fails with the group filling or draining,
    and its retry (or any later move) goes on from there. Moving a group that is in
    ``partition-streams`` there again rebuilds its partition streams that are missing, lost
    messages or have no server (a node gone for good). Returns the move (``layout``, ``done``, ``left`` per partition).
    ``partition_replicas``: the partition streams' replicas (default 1)."""

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id", "layout")

    def __init__(self, *, stream: str, group: str, layout: str, wait: float = 300.0,
                 partition_replicas: int | None = None, **kwargs: Any) -> None:
        super().__init__(stream=stream, group=group, **kwargs)
        self.layout, self.wait, self.partition_replicas = layout, wait, partition_replicas
        if not templated(layout):
            layouts.check("layout", layout)
        check_replicas("partition_replicas", partition_replicas)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1e6:
            raise ConfigError("wait", "must be a number of seconds from 0 to 1e6")

    def _validate(self) -> None:
        super()._validate()
        layouts.check("layout", self.layout)

    def execute(self, context: Any) -> dict[str, Any]:
        async def go(nc: NATS) -> dict[str, Any]:
            return (await ConsumerGroups(nc).move_layout(self.stream, self.group, self.layout, wait=self.wait,
                                                         partition_replicas=self.partition_replicas)).to_dict()

        move = self._run(go)
        if not move["done"]:
            raise LayoutError(f"group {self.group} on {self.stream} is still {move['layout']} after {self.wait:g}s: "
                              f"{sum(move['left'].values())} messages wait for its members' jobs; a retry goes on")
        self.log.info("Group %s on %s is in the %s layout", self.group, self.stream, move["layout"])
        return move


class ResizeConsumerGroupOperator(_ConsumerGroupOperator):
    """Change an elastic group's partition count (``max_members``), as ``cg resize`` does
    (``core/groups/resize.py``): stop sourcing at a cut, wait up to ``drain_timeout`` seconds
    for the members' jobs to land the old partitions, switch, resume. Nothing is lost,
    duplicated or landed out of per-key order.

    A plan by default (``dry_run=True``: the partitions per member now and after, and the
    messages still to land under the old numbering). With ``dry_run=False`` the resize runs;
    if the work queue does not drain in time the task fails with sourcing still stopped, and
    its retry (or any later run of the same resize) goes on from there. The members' jobs must
    run meanwhile (another DAG, or a DAG run after this task started). ``mappings``: new
    member mappings, required when the group maps members explicitly. Returns the plan.
    """

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id", "max_members", "mappings")

    def __init__(self, *, stream: str, group: str, max_members: int | str, mappings: Any = None,
                 dry_run: bool = True, drain_timeout: float = 300.0, **kwargs: Any) -> None:
        super().__init__(stream=stream, group=group, **kwargs)
        self.max_members, self.mappings = max_members, mappings
        self.plan_only, self.drain_timeout = dry_run, drain_timeout  # (BaseOperator has dry_run())
        if not templated(max_members):
            self._count()
        if isinstance(drain_timeout, bool) or not isinstance(drain_timeout, int | float) or drain_timeout <= 0:
            raise ConfigError("drain_timeout", "must be a number of seconds > 0")

    def _count(self) -> int:
        value = literal("max_members", self.max_members)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError("max_members", f"must be an integer >= 1 (got {self.max_members!r})")
        return value

    def _validate(self) -> None:
        super()._validate()
        self._count()

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_provider_cg.core.groups.resize import GroupResize

        async def go(nc: NATS) -> dict[str, Any]:
            resizes = GroupResize(nc)
            mappings = literal("mappings", self.mappings)
            if self.plan_only:
                return (await resizes.plan(self.stream, self.group, self._count(), mappings)).to_dict()
            return (await resizes.execute(self.stream, self.group, self._count(), mappings,
                                          drain_timeout=self.drain_timeout)).to_dict()

        plan = self._run(go)
        self.log.info("Resize of group %s on %s: %s -> %s partitions, %s", self.group, self.stream,
                      plan["max_members"], plan["new_max_members"],
                      "done" if plan["state"] == "done" else f"dry run ({plan['backlog']} message(s) to land first)")
        return plan


class ConsumerGroupStatusOperator(_ConsumerGroupOperator):
    """Push ``GroupStatus.to_dict()`` to XCom: backlog per partition and member, pins, totals,
    and the lag users alert on: ``oldest_pending_age_s`` of the group and of each member."""

    ui_color = "#d9ead3"

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_provider_cg.core.groups.lag import group_lag

        async def go(nc: NATS) -> tuple[GroupStatus, GroupLag]:
            st = await ConsumerGroups(nc).status(self.stream, self.group)
            return st, await group_lag(nc, self.stream, self.group, status=st)

        st, lag = self._run(go)
        self.log.info(
            "%s group %s on %s: backlog %s, pending %s, ack pending %s, oldest pending %ss, inactive members %s%s",
            st.kind, self.group, self.stream, st.backlog, st.num_pending, st.num_ack_pending,
            lag.oldest_pending_age_s, st.inactive_members,
            f", sourcing stopped by an unfinished {st.sourcing_stopped.get('op')}" if st.sourcing_stopped else "",
        )
        return lag.add_to(st.to_dict())
