"""The public API for a training loop of your own: what it needs to be kept alive, nothing else.

    from resilient_slurm.api import Session

    with Session.from_env(model, optimizer, scheduler, data) as s:   # run dir, ranks, signals
        s.resume()                                                    # restores what was passed
        for step in s.steps(max_steps):                               # from the resumed step on
            loss = train_one_step()
            s.log(step, loss=loss, tokens=n)                          # metrics.jsonl + tracker + console
            if s.end_of_step(step):                                   # after every step: agreed stop, saves
                break
    # the block exits with status 75 (launch again to resume) after a stop, normally when done

`data` is the data position: an object with `state_dict()` and `load_state_dict()`, or a dict, saved
as JSON. The Session reseeds no random generator (a resume restores the saved states), and refuses
in one line (an `InputError`, exit status 2) what it cannot keep: a data object without
`state_dict()`, a metric or a position JSON cannot hold, a loop that skips `end_of_step`, a model
whose tensors changed since its checkpoint.

Launch it with `python -m resilient_slurm.launch entry=MODULE:FUNCTION ...` (locally, on Slurm, in
a sweep): the function gets the composed config, the session everything else. `examples/own_loop/`
is a complete loop, and its plain twin without any of this.
"""

from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.errors import InputError
from resilient_slurm.session.session import Session

__all__ = ["ExitCode", "InputError", "Session", "TrainState"]
