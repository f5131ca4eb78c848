"""A stage as a run of the `rlhf-stage` deployment, waited for with deadlines.

`run_deployment` without a timeout waits forever, and with one it returns a run that may
still be scheduled: neither tells a user that no worker is serving the pool. So the run is
started without waiting, then watched against two deadlines:
- while it is Scheduled (no worker has taken it: no worker runs, the pool is paused or full),
  `start_timeout_s`; it is then cancelled outright, so it cannot start later behind the
  user's back;
- once a worker took it (Pending, while the image is pulled, then Running), `timeout_s`; it
  is then set Cancelling, so the worker stops its container, and waited for until it ends,
  so that nothing of it still runs when the pipeline moves on or lets the repository go.
"""

from __future__ import annotations

import time

from prefect import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.states import Cancelled, Cancelling, Failed, State

STAGE_DEPLOYMENT = "rlhf-stage/rlhf-stage"
STOP_GRACE_S = 300  # how long a cancelled run may take to stop its container


def run_stage_deployment(
    parameters: dict, start_timeout_s: float, timeout_s: float, poll_s: float = 2.0
) -> tuple[FlowRun, State]:
    """Start a run of the stage deployment and wait for its final state; a run no worker
    took within `start_timeout_s`, or that ran past `timeout_s`, is cancelled and reported
    as a Failed state that says which."""
    run = run_deployment(STAGE_DEPLOYMENT, parameters=parameters, timeout=0)
    scheduled_since = time.monotonic()
    taken_at: float | None = None
    with get_client(sync_client=True) as client:
        pool = client.read_deployment(run.deployment_id).work_pool_name
        while True:
            run = client.read_flow_run(run.id)
            state = run.state
            if state is not None and state.is_final():
                return run, state
            now = time.monotonic()
            if state is None or state.type == StateType.SCHEDULED:
                if now - scheduled_since > start_timeout_s:
                    client.set_flow_run_state(run.id, Cancelled(message="no worker took it"))
                    waiting = state.name if state else "Scheduled"
                    return run, Failed(
                        message=f"flow run {run.name} of {STAGE_DEPLOYMENT} stayed {waiting} "
                        f"for {start_timeout_s:g} s: no worker of pool {pool} took it; is "
                        f"`prefect worker start --pool {pool}` running?"
                    )
            else:
                scheduled_since = now  # a retry that is Scheduled again gets a fresh wait
                taken_at = taken_at or now
                if now - taken_at > timeout_s:
                    client.set_flow_run_state(run.id, Cancelling(message="ran too long"))
                    ended = wait_until_final(client, run.id, STOP_GRACE_S, poll_s)
                    return run, Failed(
                        message=f"flow run {run.name} ({state.name}) went past its "
                        f"{timeout_s:g} s limit and was cancelled; it ended {ended}"
                    )
            time.sleep(poll_s)


def wait_until_final(client, flow_run_id, grace_s: float, poll_s: float) -> str:
    """The name of the state the run ended in, or a note that it had not within grace_s."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        state = client.read_flow_run(flow_run_id).state
        if state is not None and state.is_final():
            return state.name
        time.sleep(poll_s)
    return f"not within {grace_s:g} s: check the worker"
