"""``cockpit demo --model gpt``: the Markov chain, the nanoGPT and the run with its panels."""

import math

import numpy as np
import pytest
import torch
from cockpit_demo import command, training
from cockpit_demo.language import (
    BLOCK_SIZE,
    VOCAB,
    MarkovChain,
    load_token_windows,
    make_gpt,
)
from cockpit_demo.training import evaluate, per_sample_losses, run_demo

from cockpit_core.cli.main import main
from cockpit_core.log import read_run

ATTENTION_LAYERS = ["transformer.h.0.attn", "transformer.h.1.attn"]
HEADS = 4
ACTIVATIONS = [
    *(
        f"transformer.h.{i}{name}"
        for i in range(2)
        for name in (
            ".ln_1",
            ".attn.c_attn",
            ".attn.c_proj",
            ".ln_2",
            ".mlp.c_fc",
            ".mlp.c_proj",
            "",
        )
    ),
    "transformer.ln_f",
    "lm_head",
]
"""What ``activations`` reads in nanoGPT: linear and normalization layers, blocks, the head."""


def test_the_chain_scores_tokens_by_its_probabilities():
    chain = MarkovChain.seeded(5, vocab=6, successors=3)
    tokens = chain.sample(200, torch.Generator().manual_seed(0))
    succ, probs = chain.successors.tolist(), chain.probs.tolist()
    expected = []
    for a, b, c in zip(tokens[:-2].tolist(), tokens[1:-1].tolist(), tokens[2:].tolist()):
        assert c in succ[b]  # only the successors of the last token follow it
        expected.append(-math.log(probs[a][b][succ[b].index(c)]))
    assert torch.allclose(chain.nll(tokens), torch.tensor(expected, dtype=torch.float64))
    assert torch.allclose(chain.probs.sum(-1), torch.ones(6, 6, dtype=torch.float64))


def test_the_stream_is_drawn_from_the_chain():
    # Given its context, each token's -log P has mean H(P(.|a, b)): the walk's mean -log P
    # minus its mean conditional entropy averages 0, within 4 standard errors. Sampling
    # successors uniformly instead would leave a gap of the mean KL divergence, ~0.3 here.
    chain = MarkovChain.seeded(7)
    tokens = chain.sample(30_000, torch.Generator().manual_seed(1))
    p = chain.probs[tokens[:-2], tokens[1:-1]]  # [N, K]: the distribution of each next token
    entropy = -(p * p.log()).sum(-1)
    variance = (p * p.log().square()).sum(-1) - entropy.square()
    gap = (chain.nll(tokens) - entropy).mean().item()
    assert abs(gap) < 4 * math.sqrt(variance.mean().item() / len(p))


def test_the_windows_are_the_same_stream_shifted_by_one_token():
    first, again = load_token_windows(), load_token_windows()
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # the same on every call
    x, y, nll = first
    assert x.shape == y.shape == nll.shape == (937, BLOCK_SIZE)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:-1, -1], x[1:, 0])
    assert int(x.max()) < VOCAB and torch.isfinite(nll).all()
    # the chain's own loss sits far below a guess among the 32 tokens
    assert 0.7 < nll.mean().item() < 0.9 < math.log(VOCAB)


def test_the_gpt_is_nanogpt_tied_and_starts_near_a_uniform_guess():
    torch.manual_seed(0)
    model = make_gpt()
    assert model.lm_head.weight is model.transformer.wte.weight
    x, y, _ = load_token_windows()
    loss, accuracy = evaluate(model, x[:64], y[:64])
    # nanoGPT's N(0, 0.02^2) head on LayerNorm-ed features (RMS ~1, d 64): logits of standard
    # deviation ~0.02 * 8 = 0.16 cost ~0.16^2 / 2 = 0.013 above ln 32; PyTorch's N(0, 1)
    # embedding as the head would give logits of scale ~8 and a loss far above (3.6 here)
    assert 0 < loss - math.log(VOCAB) < 0.04


def test_per_sample_losses_and_accuracy_of_token_logits_match_loops():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 7, (3, 5), generator=gen)
    expected = []
    for n in range(3):
        tokens = [
            math.log(sum(math.exp(v) for v in logits[n, t].tolist())) - logits[n, t, y[n, t]].item()
            for t in range(5)
        ]
        expected.append(sum(tokens) / 5)
    assert torch.allclose(per_sample_losses(logits, y), torch.tensor(expected, dtype=torch.float64))
    images = logits[:, 0]  # [B, C] with targets [B]: the loss of each sample
    assert torch.allclose(
        per_sample_losses(images, y[:, 0]),
        torch.tensor(
            [
                math.log(sum(math.exp(v) for v in images[n].tolist())) - images[n, y[n, 0]].item()
                for n in range(3)
            ],
            dtype=torch.float64,
        ),
    )
    hits = sum(int(logits[n, t].argmax() == y[n, t]) for n in range(3) for t in range(5))
    loss, accuracy = evaluate(lambda x: (logits, None), None, y)  # nanoGPT's (logits, loss)
    assert accuracy == pytest.approx(hits / 15)
    assert loss == pytest.approx(sum(expected) / 3)


@pytest.mark.parametrize("preset", ["health", "economy"])
def test_the_gpt_demo_records_every_quantity_of_its_preset_without_errors(tmp_path, capsys, preset):
    from cockpit_core.plugin.registry import default_registry

    run = tmp_path / "run"
    argv = ["demo", "--model", "gpt", "--preset", preset, "--steps", "4", "--out", str(run)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "loss: train " in out and "(the chain's own 0.7" in out and "accuracy: train" in out
    assert (run / "dashboard.png").read_bytes().startswith(b"\x89PNG")
    data, written = read_run(run / "log.jsonl"), read_run(run / "output.json")
    assert data.errors == [] and written.errors == [] and data.skipped == []
    assert written.output.keys() == data.output.keys()
    names = {
        q if isinstance(q, str) else q["name"]
        for q in default_registry().presets[preset].quantities
    }
    tracked = [s for s, values in data.output.items() if set(values) - {"metrics"}]
    assert tracked == [0, 1, 2, 3]
    for step in range(3):  # alpha, update_size and update_ratio of the last step need a next one
        assert names <= set(data.output[step])
    assert sorted(data.metrics) == [0, 4]
    assert 0 < data.metrics[0]["valid_loss"] - math.log(VOCAB) < 0.04  # untrained: see above
    if preset == "economy":  # per-sample statistics of all 28 parameters (the head is wte)
        for step in range(4):
            for name in ("norm_test", "inner_test", "ortho_test"):
                value = data.output[step][name]
                assert math.isfinite(value["total"]) and len(value["per_param"]) == 28
    if preset == "health":
        for step in range(4):
            attention = data.output[step]["attention"]
            assert attention["modules"] == ATTENTION_LAYERS and attention["heads"] == [HEADS] * 2
            assert np.isfinite(attention["max_logit"]).all()
            assert np.shape(attention["max_logit"]) == (2, HEADS)
            activations = data.output[step]["activations"]
            assert activations["modules"] == ACTIVATIONS
            assert np.isfinite(activations["rms"]).all() and np.isfinite(activations["amax"]).all()
            logits = data.output[step]["logits"]
            assert math.isfinite(logits["log_z_mean"]) and math.isfinite(logits["max_logit"])


def test_the_demo_records_the_attention_of_its_gpt_exactly(tmp_path, capsys):
    """Step 0's max logit and entropy per layer and head, against a float64 brute force.

    Hooks on the attention modules keep what each received in the training forward pass
    (the ``ln_1`` output) and its ``c_attn`` weights then; the logits ``q.k / sqrt(16)`` of
    every (sample, head, query, key up to the query) and their softmax are formed in float64.
    """
    seen = []

    def build():
        model = make_gpt()
        for block in model.transformer.h:

            def keep(module, inputs):
                if torch.is_grad_enabled():  # the training pass, not the evaluations
                    weight, bias = module.c_attn.weight, module.c_attn.bias
                    seen.append(
                        (inputs[0].detach().clone(), weight.detach().clone(), bias.detach().clone())
                    )

            block.attn.register_forward_pre_hook(keep)
        return model

    run = run_demo(
        "attention", steps=1, out=tmp_path, picture=False, build_model=build, model="gpt"
    )
    capsys.readouterr()
    recorded = read_run(run / "log.jsonl").output[0]["attention"]
    assert recorded["modules"] == ATTENTION_LAYERS and len(seen) == 2
    size = 64 // HEADS
    for layer, (x, weight, bias) in enumerate(seen):
        qkv = x.double() @ weight.double().T + bias.double()
        q, k = qkv[..., :64], qkv[..., 64:128]
        for h in range(HEADS):
            qh, kh = q[..., h * size : (h + 1) * size], k[..., h * size : (h + 1) * size]
            top, entropies = -math.inf, []
            for n in range(len(x)):
                scores = (qh[n] @ kh[n].T / math.sqrt(size)).tolist()
                for i in range(BLOCK_SIZE):
                    logits = scores[i][: i + 1]  # causal: the keys up to the query
                    top = max(top, *logits)
                    z = sum(math.exp(v - max(logits)) for v in logits)
                    p = [math.exp(v - max(logits)) / z for v in logits]
                    entropies.append(-sum(v * math.log(v) for v in p if v > 0))
            assert recorded["max_logit"][layer][h] == pytest.approx(top, rel=1e-5, abs=1e-6)
            assert recorded["entropy"][layer][h] == pytest.approx(
                sum(entropies) / len(entropies), rel=1e-5
            )


def test_an_unknown_model_is_a_usage_error_that_lists_the_models(tmp_path, capsys):
    assert command.MODELS == tuple(training.MODELS)  # the parser's choices, without torch
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--model", "cnn", "--out", str(run)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument --model: invalid choice: 'cnn'" in err
    assert "mlp" in err.split("invalid choice")[1] and "gpt" in err.split("invalid choice")[1]
    with pytest.raises(ValueError, match="unknown model 'cnn'; choose one of: mlp, gpt"):
        run_demo(model="cnn", out=run)
    assert not run.exists()


def test_the_scenarios_train_only_the_mlp(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--model", "gpt", "--scenario", "healthy", "--out", str(tmp_path / "r")])
    assert stop.value.code == 2
    assert "argument --scenario: the scenarios train the MLP" in capsys.readouterr().err
