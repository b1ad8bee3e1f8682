"""The report's lines for silent data corruption: the culprit, how it was decided, the heal; and an
undecided one with its suspects."""

from resilient_slurm.analysis.report import _sdc_lines
from resilient_slurm.ledger import Event, Sdc


def sdc(step, **over):
    fields = dict(check="replicas", tensors=["model.embed_tokens.weight"], ranks=[3], nodes=["n2"], suspects=[],
                  decided_by="rerun", evidence=[], action="healed", source="group 0", heal_s=0.197, verified=True,
                  reason="a re-run on rank 0 agrees with rank 1")
    return Event(Sdc(**{**fields, **over}), "2026-12-03T19:16:47.617Z", step, 0)


def test_each_corruption_is_one_line_naming_the_culprit_and_what_became_of_it():
    lines = _sdc_lines([sdc(5), sdc(9, ranks=[], nodes=[], suspects=["n1", "n2"], decided_by="undecided",
                                    action="undecided", source=None, heal_s=None, verified=False,
                                    reason="no majority among 2 copies")])
    assert lines == [
        "  sdc         step 5: replicas differed in model.embed_tokens.weight: rank 3 on n2 (rerun: a re-run on rank 0 "
        "agrees with rank 1); healed from group 0 in 0.197 s, verified; node taken out",
        "  " + " " * 12 + "step 9: replicas differed in model.embed_tokens.weight: undecided (no majority among 2 "
        "copies); suspects n1, n2; the attempt ended, to resume from the newest checkpoint",
    ]
