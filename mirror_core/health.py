"""Replication lag, consumer-group lag after translation, and parity verification.

* Replication lag per mirrored partition: in records, the source's last stable offset (what a
  read_committed consumer can see) minus the next upstream position still to mirror (the newest
  offset sync); in seconds, the age of the oldest unmirrored record, or, when caught up, the age of
  the newest heartbeat that reached the destination (0 without heartbeats).
* Parity: per partition over a mirrored offset range, the count and an order-sensitive SHA-256 of
  (key, value, headers without mirrorflow's provenance header, timestamp) on both sides, with every
  registry-local schema reference zeroed (the id or GUID framing a schema-serde key or value, and the
  ``__key_schema_id`` / ``__value_schema_id`` headers), and the first source offset where the sides differ.
  Records the flow rightly did not mirror (dead letters, copies its loop guard skipped) and destination records
  it did not write are left out, and counted.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from mirror_core import clients
from mirror_core.checkpoint import (
    ProbeBudget,
    SourceTranslator,
    TopicMapping,
    load_sync_store,
    topic_mappings,
)
from mirror_core.config import GroupConfig, MirrorsConfig
from mirror_core.errors import KafkaOperationError
from mirror_core.offsets import Heartbeat, OffsetSyncStore
from mirror_core.policy import build_replication_policy
from mirror_core.replicate import PROVENANCE_HEADER, SCHEMA_SERDES, provenance_of
from mirror_core.wire import GUID_FRAME_LEN, ID_FRAME_LEN, MAGIC_GUID, MAGIC_ID, SCHEMA_ID_HEADERS


@dataclass(frozen=True)
class PartitionLag:
    group: str
    mirror: str
    source_topic: str
    partition: int
    source_end: int
    mirrored_to: int | None  # next upstream offset still to mirror; None if nothing mirrored yet
    lag_records: int
    lag_seconds: float | None


@dataclass
class LagReport:
    partitions: list[PartitionLag] = field(default_factory=list)

    def totals(self) -> dict[str, dict[str, Any]]:
        """Per mirror and per group: records behind and the worst lag in seconds."""
        out: dict[str, dict[str, Any]] = {}
        for p in self.partitions:
            for key in (f"mirror {p.mirror}", f"group {p.group}"):
                t = out.setdefault(key, {"lag_records": 0, "max_lag_seconds": 0.0})
                t["lag_records"] += p.lag_records
                if p.lag_seconds is not None:
                    t["max_lag_seconds"] = max(t["max_lag_seconds"], p.lag_seconds)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"partitions": [asdict(p) for p in self.partitions], "totals": self.totals()}


def _record_age(cfg: MirrorsConfig, group: GroupConfig, topic: str, partition: int, offset: int, end: int,
                now_ms: float) -> float | None:
    for m in clients.read_partition(cfg.cluster(group.source), topic, partition, offset, end, timeout=20):
        return max(0.0, (now_ms - m.timestamp()[1]) / 1000)
    return None


def heartbeat_age(cfg: MirrorsConfig, group: GroupConfig, now_ms: float) -> float | None:
    """Age in seconds of the newest heartbeat of this flow that reached the destination."""
    if not group.heartbeats.enabled:
        return None
    remote = build_replication_policy(group).format_remote_topic(group.source, group.heartbeats.topic)
    dst = cfg.cluster(group.destination)
    try:
        ends = clients.end_offsets(dst, remote)
    except KafkaOperationError:
        return None
    newest: int | None = None
    for p, (low, high) in ends.items():
        start = max(low, high - 50)
        for m in clients.read_partition(dst, remote, p, start, high, timeout=20):
            try:
                hb = Heartbeat.from_record(m.key(), m.value())
            except Exception:  # noqa: BLE001 - someone else's record in the topic
                continue
            if hb.source_cluster_alias == group.source and hb.target_cluster_alias == group.destination:
                newest = max(newest or 0, hb.timestamp_ms)
    return None if newest is None else max(0.0, (now_ms - newest) / 1000)


#: ``(source bootstrap, topic, partition) -> offset`` of a committed record found in a partition that had no
#: offset sync yet (:func:`replication_lag`): while it lies in the partition's [low, high) the partition has
#: records to mirror, and its source is not read again
_UNSYNCED_RECORD: dict[tuple[str, str, int], int] = {}


def _nothing_to_mirror(cfg: MirrorsConfig, group: GroupConfig, topic: str, partition: int, low: int,
                       high: int, budget: ProbeBudget) -> bool:
    """A partition without offset syncs whose [low, high) holds no committed record for certain (only aborted
    records or transaction markers): nothing to mirror, although its offsets moved. False when it holds one, when
    the source did not answer (said in the log), or when ``budget`` is used up."""
    src = cfg.cluster(group.source)
    key = (str(src.kafka_properties().get("bootstrap.servers", "")), topic, partition)
    seen = _UNSYNCED_RECORD.get(key)
    if seen is not None and low <= seen < high:
        return False
    answered, first = budget.first(cfg, group, topic, partition, low, high)
    if first is None:
        return answered
    if len(_UNSYNCED_RECORD) > 100_000:
        _UNSYNCED_RECORD.clear()
    _UNSYNCED_RECORD[key] = first
    return False


def replication_lag(cfg: MirrorsConfig, group: GroupConfig, store: OffsetSyncStore | None = None,
                    mappings: list[TopicMapping] | None = None) -> LagReport:
    """Per source partition: its end (last stable offset), the upstream position the destination holds (the
    newest offset sync), the records between, and their age. A partition without syncs counts from its log
    start, unless it holds no committed record at all (nothing to mirror: lag 0, mirrored to its end)."""
    store = store or load_sync_store(cfg, group)
    mappings = mappings if mappings is not None else topic_mappings(cfg, group)
    now_ms = time.time() * 1000
    idle_age = heartbeat_age(cfg, group, now_ms)
    report = LagReport()
    budget = ProbeBudget()
    for m in mappings:
        for p, (low, high) in clients.end_offsets(cfg.cluster(group.source), m.source_topic).items():
            latest = store.latest(m.source_topic, p)
            mirrored_to = latest.upstream_offset if latest else None
            if mirrored_to is None and high > low and _nothing_to_mirror(cfg, group, m.source_topic, p, low, high,
                                                                         budget):
                mirrored_to = high
            start = mirrored_to if mirrored_to is not None else low
            lag = max(0, high - max(start, low))
            seconds: float | None
            if lag > 0:
                seconds = _record_age(cfg, group, m.source_topic, p, max(start, low), high, now_ms)
            else:
                seconds = idle_age if idle_age is not None else 0.0
            report.partitions.append(PartitionLag(group.name, m.mirror, m.source_topic, p, high, mirrored_to, lag,
                                                  None if seconds is None else round(seconds, 3)))
    return report


@dataclass(frozen=True)
class GroupLag:
    consumer_group: str
    destination_topic: str
    partition: int
    source_committed: int
    translated: int | None
    destination_end: int  # position after the last mirrored record
    lag_records: int | None  # offsets between; transaction markers inside the range count too
    note: str


def consumer_group_lag(cfg: MirrorsConfig, group: GroupConfig, store: OffsetSyncStore | None = None,
                       mappings: list[TopicMapping] | None = None) -> list[GroupLag]:
    """Where each selected source group would resume on the destination, and how far behind that is."""
    from mirror_core.checkpoint import REMAPPED, remapped_topics, source_group_offsets

    store = store or load_sync_store(cfg, group)
    mappings = mappings if mappings is not None else topic_mappings(cfg, group)
    by_src = {m.source_topic: m for m in mappings}
    remapped = remapped_topics(cfg, group, mappings)
    translator = SourceTranslator(cfg, group, store)
    out = []
    ends_cache: dict[str, dict[int, tuple[int, int]]] = {}
    for gid, offs in source_group_offsets(cfg, group, set(by_src)).items():
        for (topic, p), committed in sorted(offs.items()):
            dst_topic = by_src[topic].destination_topic
            if dst_topic not in ends_cache:
                ends_cache[dst_topic] = clients.end_offsets(cfg.cluster(group.destination), dst_topic)
            dst_end = ends_cache[dst_topic].get(p, (0, 0))[1]
            if topic in remapped:
                out.append(GroupLag(gid, dst_topic, p, committed, None, dst_end, None, REMAPPED))
                continue
            latest = store.latest(topic, p)
            if latest is not None:
                # the position after the last mirrored record: a trailing commit marker is not lag
                dst_end = min(dst_end, latest.downstream_offset)
            tr = translator.translate(topic, p, committed, dst_topic)
            lag = None if tr.downstream_offset is None else max(0, dst_end - tr.downstream_offset)
            out.append(GroupLag(gid, dst_topic, p, committed, tr.downstream_offset, dst_end, lag, tr.reason))
    return out


# --------------------------------------------------------------------------- parity


def record_digest(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]] | None,
                  timestamp_ms: int, key_framed: bool = False, value_framed: bool = True) -> bytes:
    """A digest of what a consumer sees, with every registry-local schema reference zeroed.

    Schema ids and GUIDs are registry-local, so a correct mirror changes them: the id (``0x00`` + int32)
    or GUID (``0x01`` + 16 bytes) framing the key (``key_framed``: a schema serde) and the value
    (``value_framed``), and the references in ``__key_schema_id`` / ``__value_schema_id`` headers, are
    zeroed on both sides. Every other byte counts.
    """
    h = hashlib.sha256()
    for part in (_normalise(key) if key_framed else key, _normalise(value) if value_framed else value):
        h.update(b"\x00" if part is None else b"\x01" + struct.pack(">i", len(part)) + part)
    for name, val in headers or []:
        if name == PROVENANCE_HEADER:
            continue
        if name in SCHEMA_ID_HEADERS:
            val = _normalise(val)
        h.update(b"\x02" + name.encode() + b"\x00" + (b"-" if val is None else b"+" + val))
    h.update(struct.pack(">q", timestamp_ms))
    return h.digest()


def _normalise(data: bytes | None) -> bytes | None:
    """``data`` with the schema id or GUID of its framing zeroed (unframed data unchanged)."""
    if data is None or not data:
        return data
    if data[0] == MAGIC_ID and len(data) >= ID_FRAME_LEN:
        return bytes(ID_FRAME_LEN) + data[ID_FRAME_LEN:]
    if data[0] == MAGIC_GUID and len(data) >= GUID_FRAME_LEN:
        return b"\x01" + bytes(GUID_FRAME_LEN - 1) + data[GUID_FRAME_LEN:]
    return data


@dataclass(frozen=True)
class PartitionParity:
    source_topic: str
    destination_topic: str
    partition: int
    source_range: tuple[int, int]
    destination_range: tuple[int | None, int | None]
    source_count: int
    destination_count: int
    source_checksum: str
    destination_checksum: str
    first_mismatch_offset: int | None  # source offset of the first record that differs
    ok: bool
    note: str = ""


def verify_parity(cfg: MirrorsConfig, group: GroupConfig, store: OffsetSyncStore | None = None,
                  mappings: list[TopicMapping] | None = None) -> list[PartitionParity]:
    """Compare every mirrored partition over the range the offset-sync history covers: what a consumer of the
    source reads there, but the records the flow rightly did not mirror (:class:`_Unmirrored`), against what a
    consumer of the destination reads in the matching range, but the records the flow did not write there."""
    store = store or load_sync_store(cfg, group)
    mappings = mappings if mappings is not None else topic_mappings(cfg, group)
    src, dst = cfg.cluster(group.source), cfg.cluster(group.destination)
    sides = _mirror_sides(cfg, group)
    dead: dict[tuple[str, int], set[int]] | None = None  # read once, only when a partition needs it
    out = []
    for m in mappings:
        src_ends = clients.end_offsets(src, m.source_topic)
        try:
            dst_ends = clients.end_offsets(dst, m.destination_topic)
        except KafkaOperationError:
            dst_ends = {}
        framed, provenance = sides.get(m.mirror, ((False, True), False))
        for p, (low, _high) in src_ends.items():
            oldest, latest = store.oldest(m.source_topic, p), store.latest(m.source_topic, p)
            if oldest is None or latest is None:
                continue
            if len(dst_ends) < len(src_ends):
                out.append(PartitionParity(m.source_topic, m.destination_topic, p, (0, 0), (None, None), 0, 0, "",
                                           "", None, True, "skipped: destination has fewer partitions (remapped)"))
                continue
            u0 = max(oldest.upstream_offset, low)
            u1 = latest.upstream_offset
            # the range ends where the writer's newest sync puts it (a position-only one too: it is the writer's own)
            drange = (_downstream_from(store, m.source_topic, p, u0), latest.downstream_offset)
            skip = _Unmirrored(group.source, group.destination if provenance else None, frozenset())
            res = _compare(src, dst, m, p, (u0, u1), drange, framed, skip)
            if not res.ok and res.source_count > res.destination_count:
                # records the source has and the destination lacks: those routed to the dead-letter topic are not
                # missing (read only now: a group's dead letters can be many, and most verifies need none)
                if dead is None:
                    dead = _dead_letters(dst, group.dlq_topic)
                gone = frozenset(dead.get((m.source_topic, p), ()))
                if gone:
                    res = _compare(src, dst, m, p, (u0, u1), drange, framed, skip._replace(dead_lettered=gone))
            out.append(res)
    return out


def _downstream_from(store: OffsetSyncStore, topic: str, p: int, u: int) -> int | None:
    """Where the destination range of a parity check starts for the source position ``u``: its translation,
    or, inside a run of records the loop guard skipped (no translation), the next sync that maps somewhere."""
    t = store.translate(topic, p, u)
    if t.downstream_offset is not None:
        return t.downstream_offset
    return next((s.downstream_offset for s in store.syncs(topic, p)
                 if s.upstream_offset >= u and s.downstream_offset >= 0), None)


def _mirror_sides(cfg: MirrorsConfig, group: GroupConfig) -> dict[str, tuple[tuple[bool, bool], bool]]:
    """Mirror name -> (whether its keys / values carry a schema reference (a schema serde), whether it marks
    records with their provenance and skips those that came from its destination: the loop guard)."""
    from mirror_core.provision import selected_mirrors
    from mirror_core.stream import default_provenance

    return {m.name: ((m.settings.serdes.key in SCHEMA_SERDES, m.settings.serdes.value in SCHEMA_SERDES),
                     default_provenance(m.settings.provenance_headers, m.source_topic or "", m.destination_topic or ""))
            for m in selected_mirrors(cfg, group)}


class _Unmirrored(NamedTuple):
    """Which records parity leaves out, on either side. On the source: with the loop guard on (``destination``
    set), the records whose provenance names the source or the destination (copies, which the flow skips), and
    the records in ``dead_lettered`` (their offsets; routed to the dead-letter topic). On the destination, with
    the loop guard on: the records this flow did not write (provenance not ending with the source: the
    destination's own records, or another flow's)."""

    source: str
    destination: str | None
    dead_lettered: frozenset[int]

    def on_source(self, offset: int, headers: list[tuple[str, bytes | None]] | None) -> str | None:
        if offset in self.dead_lettered:
            return "dead letters"
        if self.destination is not None and {self.source, self.destination} & set(provenance_of(headers)):
            return "copies skipped by the loop guard"
        return None

    def foreign(self, headers: list[tuple[str, bytes | None]] | None) -> bool:
        if self.destination is None:
            return False
        prov = provenance_of(headers)
        return not prov or prov[-1] != self.source


def _dead_letters(dst: Any, topic: str) -> dict[tuple[str, int], set[int]]:
    """(source topic, partition) -> the source offsets of the records in the dead-letter ``topic`` (none when the
    topic is not there)."""
    out: dict[tuple[str, int], set[int]] = {}
    try:
        ends = clients.end_offsets(dst, topic)
    except KafkaOperationError:
        return out
    for p, (low, high) in ends.items():
        for rec in clients.read_partition(dst, topic, p, low, high):
            h = {k: v for k, v in rec.headers() or [] if v is not None}
            try:
                where = (h["mirrorflow.source.topic"].decode(), int(h["mirrorflow.source.partition"]))
                out.setdefault(where, set()).add(int(h["mirrorflow.source.offset"]))
            except (KeyError, ValueError, UnicodeDecodeError):
                continue  # not a dead letter of ours
    return out


def _compare(src: Any, dst: Any, m: TopicMapping, p: int, urange: tuple[int, int],
             drange: tuple[int | None, int | None], framed: tuple[bool, bool] = (False, True),
             skip: _Unmirrored | None = None) -> PartitionParity:
    hs, hd = hashlib.sha256(), hashlib.sha256()
    ns = nd = 0
    first: int | None = None
    left_out: dict[str, int] = {}
    d_iter: Iterator[Any] = iter(clients.read_partition(dst, m.destination_topic, p, drange[0] or 0, drange[1] or 0)) \
        if drange[0] is not None and drange[1] is not None else iter(())
    if skip is not None:
        d_iter = _written_by_flow(d_iter, skip, left_out)
    for sm in clients.read_partition(src, m.source_topic, p, urange[0], urange[1]):
        why = skip.on_source(sm.offset(), sm.headers()) if skip is not None else None
        if why is not None:
            left_out[why] = left_out.get(why, 0) + 1
            continue
        sd = record_digest(sm.key(), sm.value(), sm.headers(), sm.timestamp()[1], *framed)
        hs.update(sd)
        ns += 1
        dm = next(d_iter, None)
        if dm is None:
            first = sm.offset() if first is None else first
            continue
        dd = record_digest(dm.key(), dm.value(), dm.headers(), dm.timestamp()[1], *framed)
        hd.update(dd)
        nd += 1
        if dd != sd and first is None:
            first = sm.offset()
    for dm in d_iter:
        hd.update(record_digest(dm.key(), dm.value(), dm.headers(), dm.timestamp()[1], *framed))
        nd += 1
        if first is None:
            first = urange[1]
    ok = ns == nd and hs.digest() == hd.digest()
    note = ", ".join(f"{n} {why} left out" for why, n in sorted(left_out.items()))
    return PartitionParity(m.source_topic, m.destination_topic, p, urange, drange, ns, nd, hs.hexdigest()[:16],
                           hd.hexdigest()[:16], None if ok else first, ok, note)


def _written_by_flow(records: Iterator[Any], skip: _Unmirrored, left_out: dict[str, int]) -> Iterator[Any]:
    """The destination's ``records`` the flow wrote (see :class:`_Unmirrored`); the others are counted."""
    for rec in records:
        if skip.foreign(rec.headers()):
            left_out["destination records the flow did not write"] = \
                left_out.get("destination records the flow did not write", 0) + 1
            continue
        yield rec
