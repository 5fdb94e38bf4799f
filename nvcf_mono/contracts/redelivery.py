"""How many times a request may be delivered, and how long a delivery may wait for a pausing instance.

Rules the invocation plane and the worker share about redelivery, kept apart from the stream and
consumer specs so that a worker, whose start is on every cold start's path, does not import the bus's
declarations for them.
"""

from __future__ import annotations

#: Seconds a delivery that reaches an instance as it pauses waits for it (then it goes back).
PAUSED_HOLD = 10.0

#: Deliveries beyond ``max_deliver`` a request may use up without a failure being seen: an instance
#: that paused for health hands back what it had just fetched, and a worker killed outright lets
#: its delivery time out. Past that the request is given up (answered 500), never left unanswered.
UNSEEN_FAILURE_SLACK = 5


def given_up(num_delivered: int, max_deliver: int) -> bool:
    """Whether a delivery is past every retry the platform allows (it is answered, not served)."""
    return num_delivered > max_deliver + UNSEEN_FAILURE_SLACK


def given_up_detail(num_delivered: int) -> str:
    """The 500 problem's detail for a request given up."""
    return f"the request was delivered {num_delivered} times and never answered (instances lost while serving it)"
