"""benchmarks.copy_probe: it measures every copy a trace makes, at the head taught to make it."""


def test_the_copy_probe_counts_each_traces_copies_and_reads_the_heads_attention():
    """Each compose trace reads its row and four values and writes four sums (three running, the
    total) and four addends; each count trace four counted colours; each lookup example eight values;
    a colour trace a row and a column. The shipped
    large model was never taught these heads, so its heads give the copied words little weight: the
    probe must not report an untaught pointer as one."""
    from benchmarks.copy_probe import measure
    from benchmarks.train_tiny import from_checkpoint

    model, processor, tokenizer, _ = from_checkpoint("trained:large")
    model.eval()
    rows = measure(model, processor, tokenizer, 4)
    compose = {k: v["positions"] for k, v in rows["compose traces"].items()}
    assert compose == {"copy": 16, "sum": 16, "addend": 16, "place": 4}
    places = rows["colour traces"]["place"]["positions"]
    assert places % 2 == 0 and places > 0
    assert rows["count traces"]["copy"]["positions"] == 16 and rows["count traces"]["addend"]["positions"] == 16
    assert rows["lookup"]["copy"]["positions"] == 32 and rows["lookup"]["sum"]["positions"] == 32
    for kinds in rows.values():
        for r in kinds.values():
            assert 0 <= r["weight"] < 0.3 and 0 <= r["right"] <= 1
