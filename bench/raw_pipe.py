"""The baseline: one Python process, confluent-kafka consume -> produce, nothing else.

Keeps partition, key, value, headers and CreateTime, reads ``read_committed`` and writes with
an idempotent ``acks=all`` producer (what mirrorflow's ``at_least_once`` does), but does no
schema translation, no offset syncs, no dead letters, no transactions. It is the floor for
what a Python mirror can cost on this machine. Runs until SIGTERM, then flushes and exits.

``--transaction-records N`` writes in transactions of N records instead, or fewer when the source has no
more for now (the bench's burn-in: it leaves the brokers' transactional paths compiled as well as their bulk
ones, so the first ``exactly_once`` drain measured does not pay for them).

    python bench/raw_pipe.py --src HOST:PORT --dst HOST:PORT --topic T --to T2 [--transaction-records N]
"""

from __future__ import annotations

import argparse
import signal
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--to", required=True)
    ap.add_argument("--transaction-records", type=int, default=0, metavar="N",
                    help="write in transactions of N records (0, the default: no transactions)")
    args = ap.parse_args(argv)
    every = args.transaction_records

    stop = False

    def on_term(_sig: int, _frm: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    c = Consumer({"bootstrap.servers": args.src, "group.id": f"bench-raw-{time.time_ns()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False, "log_level": 3,
                  "fetch.queue.backoff.ms": 10})  # see bench.observe.FAST_FETCH
    md = c.list_topics(args.topic, timeout=30).topics[args.topic]
    c.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in md.partitions])
    conf = {"bootstrap.servers": args.dst, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "batch.size": 1_000_000, "log_level": 3}
    if every:
        conf["transactional.id"] = f"bench-raw-{time.time_ns()}"
    p = Producer(conf)
    if every:
        p.init_transactions(30)
        p.begin_transaction()
    produce = p.produce
    in_txn = 0
    while not stop:
        first = c.poll(0.1)  # returns with the first record: no added latency
        for m in [first, *c.consume(5000, 0)] if first is not None else []:
            if m.error():
                continue
            while True:
                try:
                    produce(args.to, value=m.value(), key=m.key(), partition=m.partition() or 0,
                            timestamp=m.timestamp()[1], headers=m.headers())
                    break
                except BufferError:
                    p.poll(0.05)
            in_txn += 1
        if every and (in_txn >= every or (in_txn and first is None)):  # N records, or nothing more to read
            p.commit_transaction(30)
            p.begin_transaction()
            in_txn = 0
        p.poll(0)
    if every:
        p.commit_transaction(30)
    p.flush(30)
    c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
