"""Where a trained model's one-pass count is: its direct answers to held-out count questions, and
linear probes that read the count off each layer's residual stream, at the answer's position and at
the question's colour word.

    python -m training.probes.count_probe --model trained:large
    python -m training.probes.count_probe --model /tmp/run/large --n 1500

Each question is a direct count question of the grid task (the direct prompt, as `mutual`'s first
stage sends it) on a held-out image; `right` is the share whose greedy first answer token is the
count. A probe is a softmax regression over the counts 0-16 on one layer's hidden state (layer 0 =
the embeddings), fitted on the first 70 % of the questions and scored on the rest: a layer whose
probe scores well holds the count in a linearly readable form. Before any counting the probes score
about 0.3 (the options alone narrow the count to four neighbours); the shipped large model holds it
at the answer only after its last layer, and at the colour word after its third — it counts where
the colour is named and its last layer copies the count to the answer. The last line is JSON: `{"benchmark": "count_probe", "model", "n", "right", "probe":
{"answer": [per layer], "colour_word": [per layer]}}`.

Items: seeds from 2 * EVAL_SEED_BASE on, disjoint from training (below EVAL_SEED_BASE) and from the
held-out items `benchmarks.strategies` draws (EVAL_SEED_BASE to twice that).
"""

from __future__ import annotations

import argparse
import io
import json
import random

from tasks.grid import EVAL_SEED_BASE, grid_item

COUNTS = 17  # 0..16 cells of a 4 x 4 grid


def hidden_states(model, processor, tokenizer, n: int):
    """(answer states, colour-word states, counts, right): (N, layers + 1, hidden) each."""
    import torch
    from PIL import Image

    from training.examples import question_colour_at, render_example, token_at
    from tandem import prompts

    at_answer, at_colour, counts, right = [], [], [], 0
    image_token = model.config.image_token_id
    for s in range(n):
        item = grid_item(2 * EVAL_SEED_BASE + s, tier="count")
        if item.kind != "count":
            continue
        prompt, _ = render_example(item, "large", "direct", tokenizer, random.Random(0))
        pixels = processor.image_processor(images=[Image.open(io.BytesIO(item.image)).convert("RGB")],
                                           return_tensors="pt")
        tokens = int(pixels["image_grid_thw"][0].prod()) // processor.image_processor.merge_size ** 2
        prompt = prompt.replace(prompts.IMAGE_PAD, prompts.IMAGE_PAD * tokens)
        encoded = tokenizer(prompt, return_offsets_mapping=True)
        colour = token_at(encoded["offset_mapping"], question_colour_at(prompt, item))
        ids = torch.tensor([encoded["input_ids"]])
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                        mm_token_type_ids=(ids == image_token).long(), pixel_values=pixels["pixel_values"],
                        image_grid_thw=pixels["image_grid_thw"], output_hidden_states=True)
        count = sum(row.count(item.target) for row in item.cells)
        right += tokenizer.decode([int(out.logits[0, -1].argmax())]).strip() == str(count)
        at_answer.append(torch.stack([h[0, -1] for h in out.hidden_states]))
        at_colour.append(torch.stack([h[0, colour] for h in out.hidden_states]))
        counts.append(count)
    return torch.stack(at_answer), torch.stack(at_colour), torch.tensor(counts), right


def probe_accuracy(states, counts, fit: float = 0.7, steps: int = 400, seed: int = 0) -> float:
    """Held-out accuracy of a softmax regression from states (N, hidden) to counts (N,)."""
    import torch

    torch.manual_seed(seed)
    cut = int(len(counts) * fit)
    mean, std = states[:cut].mean(0), states[:cut].std(0) + 1e-6
    x = (states - mean) / std
    weight = torch.zeros(x.shape[1], COUNTS, requires_grad=True)
    bias = torch.zeros(COUNTS, requires_grad=True)
    optim = torch.optim.Adam([weight, bias], lr=0.05)
    for _ in range(steps):
        optim.zero_grad()
        loss = torch.nn.functional.cross_entropy(x[:cut] @ weight + bias, counts[:cut]) + 1e-3 * weight.pow(2).sum()
        loss.backward()
        optim.step()
    with torch.no_grad():
        return ((x[cut:] @ weight + bias).argmax(1) == counts[cut:]).float().mean().item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="trained:large", help="a checkpoint reference or path")
    parser.add_argument("--n", type=int, default=1500, help="questions drawn (count questions kept)")
    args = parser.parse_args(argv)

    from training.models import probed_model

    model, processor, tokenizer, _ = probed_model(args.model)
    answer, colour, counts, right = hidden_states(model, processor, tokenizer, args.n)
    probes = {"answer": [round(probe_accuracy(answer[:, layer], counts), 3) for layer in range(answer.shape[1])],
              "colour_word": [round(probe_accuracy(colour[:, layer], counts), 3) for layer in range(colour.shape[1])]}
    print(f"{args.model}: {len(counts)} held-out direct count questions, {right / len(counts):.1%} answered right")
    print("layer  probe at the answer  probe at the colour word")
    for layer, (a, c) in enumerate(zip(probes["answer"], probes["colour_word"])):
        print(f"{layer:>5}  {a:>19.1%}  {c:>24.1%}")
    print(json.dumps({"benchmark": "count_probe", "model": args.model, "n": len(counts),
                      "right": round(right / len(counts), 4), "probe": probes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
