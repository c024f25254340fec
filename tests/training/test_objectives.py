"""The losses: the answer-only loss, batched vision attention, and the auxiliary heads' probes."""


import pytest

from training.examples import build_task_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer(0)


def test_the_answer_only_loss_is_the_full_logits_loss(tokenizer):
    """answer_loss projects only the target positions onto the vocabulary; it must be the same loss."""
    import torch

    from training.models import TRAINED_SIZES

    from training.batches import Batcher

    from training.objectives import answer_loss, sequence_mean_loss
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    batcher = Batcher("small", tok, processor.image_processor, model.config.image_token_id, seed=3)
    for objective in ("direct", "reason"):
        batcher.mix = {objective: 1.0}
        batch = batcher.batch(4)
        labels = batch.pop("labels")
        full = sequence_mean_loss(model(**batch).logits, labels)
        assert torch.allclose(answer_loss(model, batch, labels), full, atol=1e-5), objective


def test_batched_vision_attention_is_the_models_attention_bit_for_bit(tokenizer):
    """batch_vision_attention stacks a batch's images into one attention call: the visual tokens and
    the gradients must be the model's own exactly (the shipped small model's command reproduces its
    weights only so), and images of several sizes must still take the model's loop."""
    import torch

    from training.models import TRAINED_SIZES, batch_vision_attention

    from training.batches import Batcher
    from tandem.checkpoints import new_tiny

    model, processor, tok = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    fast, _, _ = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    batch_vision_attention(fast)
    batcher = Batcher("small", tok, processor.image_processor, model.config.image_token_id, seed=3)
    batch = batcher.batch(3)
    outputs = []
    for m in (model, fast):
        tokens = torch.cat(m.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"]).pooler_output)
        tokens.square().sum().backward()
        outputs.append((tokens, [p.grad for p in m.model.visual.parameters() if p.grad is not None]))
    assert torch.equal(outputs[0][0], outputs[1][0])
    assert len(outputs[0][1]) == len(outputs[1][1]) > 10
    assert all(torch.equal(a, b) for a, b in zip(outputs[0][1], outputs[1][1]))
    attention, own = fast.model.visual.blocks[0].attn, model.model.visual.blocks[0].attn
    hidden = torch.randn(192, attention.dim)
    angles = torch.randn(len(hidden), attention.head_dim)
    cos_sin = (angles.cos(), angles.sin())
    for bounds in ([0, 64, 128, 192], [0, 100, 192]):  # one size: batched; two: the model's loop
        cu = torch.tensor(bounds)
        assert torch.equal(attention(hidden, cu, cos_sin), own(hidden, cu, cos_sin)), bounds


def test_an_added_kind_stays_out_of_the_other_kinds_mean():
    """`trace_attention_loss`: the kinds a phase teaches are averaged, the kinds it does not name are
    left out, and `asked` (an any-question's colour) and `verdict` are added beside the mean, so naming
    them leaves every other kind's weight as it was."""
    import torch

    from training.objectives import TRACE_HEADS, trace_attention_loss

    class Probe:  # a head whose loss per kind is a known number: the copies' count times its weight
        def __init__(self, weight):
            self.weight = weight

        def loss(self, rows):
            return torch.tensor(float(len(rows)) * self.weight)

    heads = {"copy": (0, 0), "sum": (0, 1), "addend": (1, 0), "place": (1, 1), "asked": (2, 0), "verdict": (2, 1)}
    tracers = {(0, 0): Probe(1.0), (0, 1): Probe(10.0), (1, 0): Probe(100.0), (1, 1): Probe(1000.0),
               (2, 0): Probe(5.0), (2, 1): Probe(0.5)}
    rows = lambda n: torch.zeros(n, 3, dtype=torch.long)  # noqa: E731
    copies = {"copy": rows(2), "sum": rows(1), "addend": rows(0), "place": None, "asked": rows(3), "verdict": rows(4)}
    assert set(copies) == set(TRACE_HEADS)
    before = {"trace_kinds": ["copy", "sum", "addend", "place"], "trace_heads": heads}
    named = {**before, "trace_kinds": before["trace_kinds"] + ["asked"]}
    mean, added = trace_attention_loss(tracers, before, copies)
    assert mean.item() == (2.0 + 10.0) / 2 and added is None  # no copies of addend or place: not in the mean
    mean, added = trace_attention_loss(tracers, named, copies)
    assert mean.item() == (2.0 + 10.0) / 2 and added.item() == 15.0
    mean, added = trace_attention_loss(tracers, {**named, "trace_kinds": ["asked"]}, copies)
    assert mean is None and added.item() == 15.0
    mean, added = trace_attention_loss(tracers, {**named, "trace_kinds": named["trace_kinds"] + ["verdict"]}, copies)
    assert mean.item() == (2.0 + 10.0) / 2 and added.item() == 15.0 + 2.0


def test_number_tokens_start_on_circles_where_a_sum_modulo_10_is_a_rotation(tokenizer):
    """`init_number_embeddings`: both spellings of a number share the circle dimensions, in the input
    and the output tables; on the period-10 circle, turning a's point by b's angle lands on (a + b) mod
    10's; other tokens and the remaining dimensions keep their random start."""
    import torch

    from training.models import NUMBER_PERIODS, TRAINED_SIZES, init_number_embeddings
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, _, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    before = [t.weight.detach().clone() for t in (model.get_input_embeddings(), model.get_output_embeddings())]
    init_number_embeddings(model, tok)
    width = 2 * len(NUMBER_PERIODS)
    word = tok.convert_tokens_to_ids(tok.tokenize(" red"))[0]
    for table, old in zip((model.get_input_embeddings().weight, model.get_output_embeddings().weight), before):
        digit = {text: table[tok.convert_tokens_to_ids(tok.tokenize(text))[0]].detach() for text in
                 [str(d) for d in range(10)] + [f" {d}" for d in range(10)]}
        for d in range(10):
            assert torch.allclose(digit[str(d)][:width], digit[f" {d}"][:width])
            assert not torch.allclose(digit[str(d)][width:], digit[f" {d}"][width:])  # spellings still differ
        point = lambda d: torch.complex(digit[str(d)][0], digit[str(d)][len(NUMBER_PERIODS)])  # noqa: E731
        for a in range(10):
            for b in range(10):
                turned = point(a) * point(b) / abs(point(b))
                assert torch.allclose(turned, point((a + b) % 10), atol=1e-6)
        assert torch.equal(table[word], old[word])


def test_the_pointer_probe_reads_the_heads_own_attention(tokenizer):
    """PointerProbe recomputes one head's attention from the layer's projections: its loss must be
    minus the log of the weight the model's own (eager) attention gives the pointed key."""
    import torch

    from tasks.grid import PALETTE
    from training.models import TRAINED_SIZES
    from training.batches import Batcher
    from training.objectives import PointerProbe
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    model.set_attn_implementation("eager")
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=3,
                      direct_tiers={"count": 1.0})
    batcher.attend, batcher.mix = True, {"caption": 1.0}
    pointers = PointerProbe(model, layer=2, head=0)
    counters = PointerProbe(model, layer=2, head=2)
    copiers = PointerProbe(model, layer=3, head=1)
    for mix in ({"caption": 1.0}, {"direct": 1.0}):
        batcher.mix = mix
        batch = batcher.batch(3)
        labels = batch.pop("labels")
        pointed, counted, copied = batch.pop("pointers"), batch.pop("counters"), batch.pop("copies")
        batch.pop("readouts")
        attentions = model(**batch, output_attentions=True).attentions
        for probe, points, layer, head in ((pointers, pointed, 2, 0), (counters, counted, 2, 2), (copiers, copied, 3, 1)):
            for point in points[:5]:
                row, q, k = point[:3].tolist()
                weight = attentions[layer][row, head, q, k]
                assert torch.allclose(probe.loss(point[None, :3]), -weight.log(), atol=1e-4)
    assert len(pointed) == 0 and len(counted) > 0  # direct count questions: counters only
    image = batch["input_ids"][0] == model.config.image_token_id
    assert bool(image[counted[counted[:, 0] == 0][1:, 2]].all())  # counted keys: image tokens after the start
    # A question's count is taken at its colour word, and the answer's position copies it from there.
    assert len(copied) == 3
    for row, answer, colour in copied.tolist():
        assert answer == int((labels[row] != -100).nonzero()[0]) - 1  # predicts the answer's first token
        word = tok.decode(batch["input_ids"][row, colour]).strip()
        assert word in PALETTE and batch["input_ids"][row, :colour].tolist().count(model.config.image_token_id) == 16
        assert set(counted[counted[:, 0] == row][:, 1].tolist()) == {colour}


def test_trace_copy_heads_are_taught_at_the_copied_tokens(tokenizer):
    """In a batch, each copy's query predicts the very token its key holds (the question's value,
    colour, row or column), each sum's keys are the earlier sum's token and the addend just before it; the probes on
    TRACE_HEADS read those heads' own (eager) attention, and the copies' readouts name the copied token."""
    import torch

    from training.objectives import TRACE_HEADS, PointerProbe

    from training.models import TRAINED_SIZES

    from training.batches import Batcher
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    model.set_attn_implementation("eager")
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=4,
                      reason_tiers={"count": 0.5, "compose": 0.5})
    batcher.attend = True
    probes = {kind: PointerProbe(model, layer=layer, head=head) for kind, (layer, head) in TRACE_HEADS.items()}
    for mix, tiers in (({"reason": 1.0}, None), ({"lookup": 1.0}, None), ({"reason": 1.0}, {"perceive": 1.0})):
        batcher.mix, batcher.tiers["reason"] = mix, tiers or batcher.tiers["reason"]
        batch = batcher.batch(2)
        labels = batch.pop("labels")
        found = {kind: batch.pop(f"{kind}_copies") for kind in TRACE_HEADS}
        for key in ("pointers", "counters", "copies", "readouts"):
            batch.pop(key)
        for kind in ("copy", "place"):
            said = batch.pop(f"{kind}_readouts")
            assert said.tolist() == [[row, q, int(batch["input_ids"][row, k])] for row, q, k in found[kind].tolist()]
        if tiers:  # colour traces: a row and a column each (an "is there" trace copies none)
            assert len(found["place"]) >= 2 and len(found["place"]) % 2 == 0
        else:
            assert len(found["copy"]) >= 8 and len(found["sum"]) >= 8
        for row, q, k in found["copy"].tolist() + found["place"].tolist() + found["asked"].tolist():
            assert labels[row, q + 1] == batch["input_ids"][row, k] and labels[row, k] == -100  # from the prompt
        assert [k for _, _, k in found["addend"].tolist()] == [q - 1 for _, q, _ in found["addend"].tolist()]
        for row, q, k in found["sum"].tolist():
            assert k < q and labels[row, k] != -100  # an earlier word of the target
            assert tok.decode(batch["input_ids"][row, k]).strip().isdigit()
            assert tok.decode(labels[row, q + 1]).strip().isdigit()
        attentions = model(**batch, output_attentions=True).attentions
        for kind, (layer, head) in TRACE_HEADS.items():
            for point in found[kind][:6]:
                row, q, k = point.tolist()
                weight = attentions[layer][row, head, q, k]
                assert torch.allclose(probes[kind].loss(point[None]), -weight.log(), atol=1e-4)


def test_count_readouts_say_each_count_where_it_is_taken(tokenizer):
    """CountLens teaches the residual stream after the counting layer, where a count is taken, to
    say the count's number: a question's at its colour word (where the copy head reads), a census
    entry's at its colour word (the position that predicts the number). Its loss must be the
    cross-entropy of that layer's output read through the model's own final norm and vocabulary."""
    import torch
    import torch.nn.functional as F

    from training.objectives import COUNT_LAYER, CountLens

    from training.models import TRAINED_SIZES

    from training.batches import Batcher
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=5,
                      direct_tiers={"count": 1.0})
    batcher.attend = True
    lens = CountLens(model)
    for mix in ({"direct": 1.0}, {"census": 1.0}):
        batcher.mix = mix
        batch = batcher.batch(3)
        labels, readouts, counted, copied = (batch.pop(k) for k in ("labels", "readouts", "counters", "copies"))
        batch.pop("pointers")
        hidden = model.model(**batch, output_hidden_states=True).hidden_states[COUNT_LAYER + 1]
        assert len(readouts) > 0
        # One readout per count, at the counting head's query, its token the number the target says there.
        assert sorted(map(tuple, readouts[:, :2].tolist())) == sorted(set(map(tuple, counted[:, :2].tolist())))
        for row, at, token in readouts.tolist():
            if mix == {"direct": 1.0}:
                assert at == [c for r, _, c in copied.tolist() if r == row][0]  # the question's colour word
                assert token == labels[row][labels[row] != -100][0]  # the answer's number
            else:
                assert token == labels[row, at + 1]  # the census's number after its colour word
            assert tok.decode([token]).strip().isdigit()
        expected = F.cross_entropy(model.lm_head(model.model.language_model.norm(hidden[readouts[:, 0], readouts[:, 1]])),
                                   readouts[:, 2])
        assert torch.allclose(lens.loss(readouts), expected, atol=1e-5)
