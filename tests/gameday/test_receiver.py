"""The game day's webhook receiver, over real HTTP: each change of an alert's status is one delivery,
however often Alertmanager repeats the alert in its group's notifications."""

from __future__ import annotations

import json
import urllib.request

from growpage.gameday.receiver import run_receiver

FAST, SLOW = ({"alertname": "GrowPageVLLMTimeToFirstTokenFastBurn", "long_window": window} for window in ("1h", "6h"))


def _post(url: str, *alerts: tuple[dict, str]) -> None:
    body = json.dumps({"version": "4", "alerts": [{"labels": labels, "status": status}
                                                  for labels, status in alerts]}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5):  # noqa: S310 (loopback)
        pass


def test_a_pair_still_firing_in_its_groups_next_notification_is_no_new_page():
    with run_receiver() as receiver:
        _post(f"{receiver.url}/pager", (FAST, "firing"), (SLOW, "firing"))
        _post(f"{receiver.url}/pager", (FAST, "resolved"), (SLOW, "firing"))  # the 6h pair repeats
        assert [(n.status, n.labels["long_window"]) for n in receiver.notifications()] == [
            ("firing", "1h"), ("firing", "6h"), ("resolved", "1h")]
        assert receiver.firing() == {"GrowPageVLLMTimeToFirstTokenFastBurn"}  # the 6h pair still fires
        _post(f"{receiver.url}/pager", (FAST, "resolved"), (SLOW, "resolved"))
        assert receiver.firing() == set() and receiver.notifications()[-1].receiver == "pager"
        _post(f"{receiver.url}/pager", (FAST, "firing"))  # firing again after resolving: a new page
        assert [n.status for n in receiver.notifications()].count("firing") == 3
