"""Master-slave replication between two real nodes on loopback (pika clients)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from tests.broker_impl.nodes import PERSISTENT, drain
from tests.broker_impl.nodes import amqp as connect
from tests.broker_impl.replication.conftest import Node, wait_for


def publish(node: Node, queue: str, bodies: range, declare: bool = False) -> None:
    """Persistent publishes with confirms: pika raises NackError on a nack."""
    c = connect(node)
    try:
        ch = c.channel()
        if declare:
            ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in bodies:
            ch.basic_publish("", queue, str(i).encode(), PERSISTENT)
    finally:
        if c.is_open:
            c.close()


def _slave_cut_off(pair_factory: Any, mode: str) -> Any:
    """A pair in ``mode`` with 10 messages in ``q``, then its link cut until the master sees its slave gone."""
    pair = pair_factory(mode)
    publish(pair.master, "q", range(10), declare=True)
    pair.link.set_cut(True)
    wait_for(lambda: not pair.master.status()["slaves"], what="the master to see its slave gone")
    return pair


def test_the_slave_copies_the_log_and_the_queues_and_refuses_publishes(pair_factory):
    pair = pair_factory("sync_master", segment_bytes=4096)  # small segments: BLANKs cross the link too
    publish(pair.master, "q", range(300), declare=True)
    end = pair.wait_in_sync()
    assert pair.slave.status()["replica_end"] == end
    # byte for byte: the replica's segments are the master's
    mdir, sdir = pair.master.data_dir / "store" / "commitlog", pair.slave.data_dir / "replica" / "commitlog"
    assert sorted(os.listdir(mdir)) == sorted(os.listdir(sdir))
    assert len(os.listdir(mdir)) > 3
    for name in os.listdir(mdir):
        assert (mdir / name).read_bytes() == (sdir / name).read_bytes(), name
    # the slave knows the queue (a consumer can attach) but serves nothing and takes no publishes
    q = wait_for(
        lambda: {x["name"]: x for x in pair.slave.ctl("list_queues")}.get("q"), what="q on the slave"
    )
    assert q["messages_ready"] == 0
    with pytest.raises(ChannelClosedByBroker) as err:
        publish(pair.slave, "q", range(1))
    assert err.value.reply_code == 403 and "read-only slave" in err.value.reply_text
    assert drain(pair.master, "q") == list(range(300))


def test_a_sync_master_nacks_without_its_slave_and_confirms_again_when_it_is_back(pair_factory):
    pair = _slave_cut_off(pair_factory, "sync_master")
    with pytest.raises(NackError):
        publish(pair.master, "q", range(10, 11))
    assert "SLAVE_NOT_AVAILABLE" in pair.master.log()
    pair.link.set_cut(False)
    wait_for(lambda: pair.master.status()["slaves"], what="the slave to attach again")
    publish(pair.master, "q", range(11, 20))
    # the nacked message is in the master's log all the same: delivered, never confirmed
    assert drain(pair.master, "q") == list(range(20))


def test_an_async_master_confirms_without_its_slave(pair_factory):
    pair = _slave_cut_off(pair_factory, "async_master")
    publish(pair.master, "q", range(10, 20))  # no NackError
    behind = pair.slave.status()["replica_end"]
    assert behind < pair.master.status()["log_end"]
    pair.link.set_cut(False)
    assert pair.wait_in_sync() > behind


@pytest.mark.parametrize("role", ["sync_master", "async_master"])
def test_a_master_that_lost_its_log_tail_takes_it_back_from_the_slave(pair_factory, role):
    """What a power cut does to a ``flush = "async"`` master: its log is cut back to an older
    end while the slave holds the tail. The master must not serve before it has it back."""
    pair = pair_factory(role)
    publish(pair.master, "q", range(400), declare=True)
    end = pair.wait_in_sync()
    pair.master.kill()
    last = sorted((pair.master.data_dir / "store" / "commitlog").iterdir())[-1]
    os.truncate(last, last.stat().st_size // 2)  # a torn tail: recovery cuts at the first bad record
    pair.master.start()  # returns once the master serves, i.e. after taking the tail back
    status = pair.master.status()
    assert status["caught_up_bytes"] > 0, "the truncation removed nothing: the test shows nothing"
    assert status["log_end"] == end
    assert "took back" in pair.master.log()
    assert drain(pair.master, "q") == list(range(400))


def test_a_restarted_master_waits_for_its_slave_before_serving(pair_factory):
    pair = pair_factory("sync_master")
    publish(pair.master, "q", range(50), declare=True)
    pair.wait_in_sync()
    pair.slave.stop()
    pair.master.kill()
    pair.master.start(wait=False)
    wait_for(lambda: "waiting for a slave to hand back" in pair.master.log(), what="the master to wait")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(pair.master)  # its AMQP listener is not open yet
    pair.slave.start()
    pair.master.wait_serving()
    assert drain(pair.master, "q") == list(range(50))


def test_a_sync_master_nacks_when_its_slave_goes_silent(pair_factory):
    """A paused slave keeps its connection open and says nothing (as behind a partition that
    drops packets): the confirm waits sync_timeout_ms, then the publisher gets a nack."""
    pair = pair_factory("sync_master")
    publish(pair.master, "q", range(5), declare=True)
    assert pair.slave.proc is not None
    pair.slave.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(NackError):
            publish(pair.master, "q", range(5, 6))
        assert "FLUSH_SLAVE_TIMEOUT" in pair.master.log() or "SLAVE_NOT_AVAILABLE" in pair.master.log()
    finally:
        pair.slave.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: pair.master.status()["slaves"], what="the slave to be attached after it resumed")
    publish(pair.master, "q", range(6, 10))
    assert drain(pair.master, "q") == list(range(10))
