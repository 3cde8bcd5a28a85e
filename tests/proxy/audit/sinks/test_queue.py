"""The disk queue: order, the cursor across restarts, segments freed, the bound, a torn tail."""

from __future__ import annotations

from pathlib import Path

from sandgate.proxy.audit.sinks.queue import DiskQueue


def lines(n: int, start: int = 0) -> list[str]:
    return [f'{{"decision_id":"d{i:06d}"}}\n' for i in range(start, start + n)]


def test_reads_in_order_and_the_cursor_survives_a_restart(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, max_bytes=1 << 20)
    q.append(lines(10), fsync=True)
    got, pos = q.read(4)
    assert got == lines(4)
    q.commit(pos)
    q.close()
    again = DiskQueue(tmp_path, max_bytes=1 << 20)
    got, _ = again.read(100)
    assert got == lines(6, 4)  # what was not acknowledged, and only that


def test_an_unacknowledged_batch_is_read_again(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, max_bytes=1 << 20)
    q.append(lines(3), fsync=False)
    first, _ = q.read(3)
    second, _ = q.read(3)
    assert first == second == lines(3)


def test_segments_behind_the_cursor_are_deleted(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    for i in range(50):
        q.append(lines(20, i * 20), fsync=False)
    assert len(list(tmp_path.glob("*.seg"))) > 3
    seen: list[str] = []
    while True:
        got, pos = q.read(64)
        if not got:
            break
        seen += got
        q.commit(pos)
    assert seen == lines(1000)
    assert len(list(tmp_path.glob("*.seg"))) == 1
    assert q.pending_bytes == 0


def test_the_bound_counts_unacknowledged_bytes(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, max_bytes=65_536)
    one = lines(1)[0]
    fits = 65_536 // len(one)
    assert q.fitting(lines(fits + 10)) == fits
    q.append(lines(fits), fsync=False)
    assert q.fitting(lines(1)) == 0
    _, pos = q.read(10)
    q.commit(pos)
    assert q.fitting(lines(20)) == 10


def test_a_torn_last_line_is_cut_at_start(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, max_bytes=1 << 20)
    q.append(lines(2), fsync=True)
    q.close()
    seg = next(tmp_path.glob("*.seg"))
    with seg.open("ab") as f:
        f.write(b'{"decision_id":"torn')
    again = DiskQueue(tmp_path, max_bytes=1 << 20)
    assert again.read(10)[0] == lines(2)
    again.append(lines(1, 2), fsync=False)
    assert again.read(10)[0] == lines(3)


def test_a_writer_and_a_reader_in_two_processes_share_the_queue_through_its_files(tmp_path: Path) -> None:
    """The gateway appends and its courier delivers (sinks/courier.py): each sees the other
    only through the segments and the cursor file, and a half-written line is never read."""
    writer = DiskQueue(tmp_path, max_bytes=64 * 1024, segment_bytes=4096, side="writer")
    reader = DiskQueue(tmp_path, max_bytes=64 * 1024, segment_bytes=4096, side="reader")
    seen: list[str] = []
    for i in range(40):  # several segments rolled while the reader follows
        writer.append(lines(10, i * 10), fsync=False)
        got, pos = reader.read(7)
        seen += got
        reader.commit(pos)
    while got := reader.read(100)[0]:
        seen += got
        reader.commit(reader.read(100)[1])
    assert seen == lines(400)
    assert writer.pending_bytes == 0, "the writer learns from the cursor file what was delivered"
    assert len(list(tmp_path.glob("*.seg"))) == 1, "the reader deleted the segments it finished"
    # A line the writer is in the middle of appending is not read (nor cut by the reader).
    last = max(tmp_path.glob("*.seg"))
    with open(last, "ab") as f:
        f.write(b'{"decision_id":"half')
    assert reader.read(10)[0] == []
    with open(last, "ab") as f:
        f.write(b'"}\n')
    assert reader.read(10)[0] == ['{"decision_id":"half"}\n']
    # The bound counts what the reader has not acknowledged, as the writer reads it.
    reader.commit(reader.read(10)[1])
    batch = lines(1000)  # 27 KB
    writer.append(batch, fsync=False)
    writer.append(batch, fsync=False)
    assert writer.fitting(batch) < len(batch), "54 KB of 64 pending: a third batch does not fit"
    while got := reader.read(500)[0]:
        reader.commit(reader.read(500)[1])
    assert writer.fitting(batch) == len(batch), "delivered: room again"
    writer.close()
    reader.close()
