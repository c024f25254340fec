"""training.probes.copy_probe: it measures every copy a trace makes, at the head taught to make it."""


def test_the_copy_probe_counts_each_traces_copies_and_reads_the_heads_attention():
    """Each compose trace reads its row and four values and writes four sums (three running, the
    total) and four addends, and its answer copies the total; each count trace four counted colours;
    each lookup example eight values; a colour trace a row and a column. The shipped large model was
    taught these heads (its schedule's `trace_attend`), so the probe must find them pointing at the
    copied words; a random-initialised model of the same sizes was not, and the probe must not
    report its heads as pointers."""
    from training.probes.copy_probe import measure
    from training.models import TRAINED_SIZES, from_checkpoint
    from training.examples import build_task_tokenizer
    from tandem.checkpoints import new_tiny

    model, processor, tokenizer, _ = from_checkpoint("trained:large")
    model.eval()
    rows = measure(model, processor, tokenizer, 4)
    compose = {k: v["positions"] for k, v in rows["compose traces"].items()}
    assert compose == {"copy": 16, "sum": 16, "addend": 16, "place": 4, "verdict": 4}
    places = rows["colour traces"]["place"]["positions"]
    assert places % 2 == 0 and places > 0
    assert rows["count traces"]["copy"]["positions"] == 16 and rows["count traces"]["addend"]["positions"] == 16
    assert rows["lookup"]["copy"]["positions"] == 32 and rows["lookup"]["sum"]["positions"] == 32
    taught = ("copy", "sum", "addend", "place", "verdict")
    for kinds in rows.values():
        for kind, r in kinds.items():
            assert 0 <= r["weight"] <= 1 and 0 <= r["right"] <= 1
            if kind in taught:
                assert r["weight"] > 0.8, (kind, r)

    model, processor, tokenizer = new_tiny(TRAINED_SIZES["large"], build_task_tokenizer(0), 0)
    model.eval()
    for kinds in measure(model, processor, tokenizer, 4).values():
        for r in kinds.values():
            assert 0 <= r["weight"] < 0.3
