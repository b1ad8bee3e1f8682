"""train_state.json's one data position: checkpoints written before it (the built-in trainer's
`samples_consumed`, `epoch`, batch sizes and token mixture `data`) read into `data_state` as the
pipelines write it now, and a read and written state keeps nothing twice."""

from resilient_slurm.checkpoint.train_state import TrainState

MIXTURE = {"sequences": 96, "fingerprint": "f" * 24, "phase": {"name": "main"}, "sources": {"web": {"counter": 96}}}


def test_an_old_chat_checkpoints_position_reads_into_data_state():
    old = {"step": 12, "epoch": 1, "samples_consumed": 48, "global_batch_size": 4, "micro_batch_size": 2,
           "lora": {"rank": 4}, "unknown": 1}
    ts = TrainState.from_json(old)
    assert ts.data_state == {"samples_consumed": 48, "epoch": 1, "global_batch_size": 4, "micro_batch_size": 2}
    assert ts.lora == {"rank": 4} and ts.extra == {"unknown": 1}
    assert TrainState.from_json(ts.to_json()) == ts
    assert not {"samples_consumed", "epoch", "global_batch_size", "micro_batch_size", "data"} & set(ts.to_json())


def test_an_old_token_mixture_position_reads_into_data_state_under_mixture():
    old = {"step": 12, "epoch": 0, "samples_consumed": 96, "global_batch_size": 8, "micro_batch_size": 4,
           "data": MIXTURE}
    ts = TrainState.from_json(old)
    assert ts.data_state == {"samples_consumed": 96, "epoch": 0, "global_batch_size": 8, "micro_batch_size": 4,
                             "mixture": MIXTURE}


def test_a_user_loops_position_and_a_new_one_are_read_as_they_are():
    for doc in ({"step": 3, "data_state": {"position": 3}}, {"step": 3}):
        assert TrainState.from_json(doc).to_json() == {**doc, "tokens_seen": 0, "train_seconds": 0.0, "reason": "",
                                                       "saved_at": "", "world_size": 1, "run_id": "",
                                                       "config_hash": ""}
