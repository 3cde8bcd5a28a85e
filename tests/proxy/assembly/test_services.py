"""The gateway's services list: started in order by stage, stopped in reverse, each once."""

from __future__ import annotations

import pytest

from sandgate.proxy.assembly.services import Calls, Services, Stage

BEFORE, SERVING = Stage.BEFORE_LISTENERS, Stage.SERVING


class Recorded:
    """A subsystem with a sync start and an async stop, recording both."""

    def __init__(self, name: str, seen: list[str], *, fail_stop: bool = False) -> None:
        self.name, self.seen, self.fail_stop = name, seen, fail_stop

    def start(self) -> None:
        self.seen.append(f"start {self.name}")

    async def stop(self) -> None:
        self.seen.append(f"stop {self.name}")
        if self.fail_stop:
            raise RuntimeError("stop failed")


def services(seen: list[str], *, fail_stop: str = "") -> Services:
    listed = [
        Calls.of("audit", BEFORE, Recorded("audit", seen)),
        Calls.of("dns", SERVING, Recorded("dns", seen, fail_stop=fail_stop == "dns")),
        Calls.of("absent", SERVING, None),
        Calls.of("fleet", BEFORE, Recorded("fleet", seen)),
        Calls.of("watch", SERVING, Recorded("watch", seen)),
    ]
    return Services(s for s in listed if s is not None)


async def test_each_stage_starts_in_list_order_and_all_stop_in_reverse_list_order() -> None:
    seen: list[str] = []
    listed = services(seen)
    assert listed.names == ["audit", "dns", "fleet", "watch"]
    await listed.start(BEFORE)
    await listed.start(SERVING)
    await listed.stop()
    assert seen == [
        "start audit",
        "start fleet",
        "start dns",
        "start watch",
        "stop watch",
        "stop fleet",
        "stop dns",
        "stop audit",
    ]


async def test_only_started_services_stop_and_only_once() -> None:
    seen: list[str] = []
    listed = services(seen)
    await listed.start(BEFORE)
    await listed.stop()
    await listed.stop()
    assert seen == ["start audit", "start fleet", "stop fleet", "stop audit"]


async def test_a_failing_stop_does_not_keep_the_rest_from_stopping() -> None:
    seen: list[str] = []
    listed = services(seen, fail_stop="dns")
    await listed.start(BEFORE)
    await listed.start(SERVING)
    await listed.stop()
    assert seen[-4:] == ["stop watch", "stop fleet", "stop dns", "stop audit"]


def test_a_name_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="named twice"):
        Services([Calls("a", BEFORE), Calls("a", SERVING)])
