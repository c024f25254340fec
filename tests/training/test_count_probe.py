"""training.probes.count_probe: a linear probe reads a count that a layer holds, and not one it doesn't."""


def test_the_probe_reads_a_linearly_held_count_and_not_noise():
    import torch

    from training.probes.count_probe import probe_accuracy

    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 10, (600,), generator=g)
    noise = torch.randn(600, 32, generator=g)
    held = noise.clone()
    held[:, :10] += 4 * torch.nn.functional.one_hot(counts, 10)  # the count, one direction per value
    assert probe_accuracy(held, counts) > 0.95
    assert probe_accuracy(noise, counts) < 0.25


def test_the_shipped_large_model_holds_the_count_after_its_last_layer():
    """The shipped large model counts in one pass (the Fidelity issue's F2): most direct count
    answers right, and the count readable at the answer only once its layers have run."""
    from training.probes.count_probe import hidden_states, probe_accuracy
    from training.models import from_checkpoint

    model, processor, tokenizer, _ = from_checkpoint("trained:large")
    model.eval()
    answer, colour, counts, right = hidden_states(model, processor, tokenizer, 300)
    assert right / len(counts) > 0.8
    assert probe_accuracy(answer[:, -1], counts) > probe_accuracy(answer[:, 1], counts) + 0.3
