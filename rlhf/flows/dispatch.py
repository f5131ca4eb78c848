"""A stage as a run of the `rlhf-stage` deployment, waited for with deadlines.

`run_deployment` without a timeout waits forever, and with one it returns a run that may
still be scheduled: neither tells a user that no worker is serving the pool. So the run is
started without waiting, then watched: one deadline for a worker to start it (a container
that never starts is almost always a worker that is not running), one for it to finish.
A run that misses either is cancelled, so it cannot start later behind the user's back.
"""

from __future__ import annotations

import time

from prefect import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.states import Cancelled, Cancelling, Failed, State

STAGE_DEPLOYMENT = "rlhf-stage/rlhf-stage"
NOT_STARTED = (StateType.SCHEDULED, StateType.PENDING)  # waiting for a worker (or a slot)


def run_stage_deployment(
    parameters: dict, start_timeout_s: float, timeout_s: float, poll_s: float = 2.0
) -> tuple[FlowRun, State]:
    """Start a run of the stage deployment and wait for its final state; a run no worker
    started within `start_timeout_s`, or that ran past `timeout_s`, is cancelled and
    reported as a Failed state that says which."""
    run = run_deployment(STAGE_DEPLOYMENT, parameters=parameters, timeout=0)
    created = time.monotonic()
    started: float | None = None
    with get_client(sync_client=True) as client:
        pool = client.read_deployment(run.deployment_id).work_pool_name
        while True:
            run = client.read_flow_run(run.id)
            state = run.state
            if state is not None and state.is_final():
                return run, state
            now = time.monotonic()
            if state is None or state.type in NOT_STARTED:
                if now - created > start_timeout_s:
                    client.set_flow_run_state(run.id, Cancelled(message="never started"))
                    return run, Failed(
                        message=f"no worker started flow run {run.name} of {STAGE_DEPLOYMENT} "
                        f"within {start_timeout_s:g} s: is `prefect worker start --pool {pool}` "
                        "running?"
                    )
            else:
                started = started or now
                if now - started > timeout_s:
                    client.set_flow_run_state(run.id, Cancelling(message="ran too long"))
                    return run, Failed(
                        message=f"flow run {run.name} ran past its {timeout_s:g} s limit "
                        "and was cancelled"
                    )
            time.sleep(poll_s)
