"""Single-pass capture against a slow reference that re-runs each sequence layer by layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mice_exp.llm.capture import _Recorder, generate_batch
from mice_exp.llm.model import _OUT_U, LLM, bf16_screen, screen_bound, screened_argmax


def reference(llm: LLM, prompt: list[int], generated: list[int]):
    """Full forward over prompt + y (no padding): lens argmax per layer and chosen-token probabilities."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        out = llm.model(ids, output_hidden_states=True)
    positions = range(len(prompt) - 1, len(prompt) - 1 + len(generated))
    lens = []
    for layer in range(1, llm.n_layers):  # hidden_states[i] = output of layer i (pre-norm) for i < L
        rows = []
        for t in positions:
            logits = llm.model.get_output_embeddings()(llm.final_norm(out.hidden_states[layer][0, t]))
            if llm.softcap:
                logits = torch.tanh(logits / llm.softcap) * llm.softcap
            rows.append(int(logits.argmax()))
        lens.append(rows)
    probs = torch.softmax(out.logits[0].double(), -1)
    chosen = [float(probs[t, tok]) for t, tok in zip(positions, generated)]
    greedy = [int(out.logits[0, t].argmax()) for t in positions]
    return np.array(lens), np.array(chosen), greedy


def make_llm(tokenizer, model_type: str, **extra) -> LLM:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=16, tie_word_embeddings=True, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)  # sharper logits than the tiny init, so argmaxes are well separated
            else:
                p.uniform_(-0.9, 0.9)  # a non-trivial norm scale: a lens that skips the norm would differ
    return LLM(model=model, tokenizer=tokenizer, name=model_type, device=torch.device("cpu"))


PROMPTS = ["User Query: what is 2+2?\nAction:", "Hello", "User Query: weather in Paris tomorrow please\n"]


@pytest.mark.parametrize("model_type,extra", [("llama", {}), ("gemma3_text", {"final_logit_softcapping": 3.0})])
def test_logit_lens_equals_slow_layer_by_layer_reference(tokenizer, model_type, extra):
    llm = make_llm(tokenizer, model_type, **extra)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]  # different lengths: exercises left padding
    gens = generate_batch(llm, prompts, max_new_tokens=12)
    for prompt, gen in zip(prompts, gens):
        assert len(gen.token_ids) > 0
        lens, chosen, greedy = reference(llm, prompt, gen.token_ids)
        assert gen.token_ids == greedy  # greedy decoding
        assert lens.shape == (llm.n_layers - 1, len(gen.token_ids))
        np.testing.assert_array_equal(gen.lens_ids, lens)
        # The model runs in float64 but the recorder's log-softmax is float32 (as in a real run): |log p|
        # up to ~50 here with float32 eps 6e-8 gives relative errors up to a few 1e-6 whatever the CPU or
        # thread count; rtol 1e-4 leaves margin and still catches a wrong token or a missing softcap (>1e-2).
        np.testing.assert_allclose(gen.token_probs, chosen, rtol=1e-4)


def test_softcap_changes_nothing_but_is_applied(tokenizer):
    llm = make_llm(tokenizer, "gemma3_text", final_logit_softcapping=3.0)
    hidden = torch.randn(2, 64, dtype=torch.float64)
    logits = llm.lens_logits(hidden)
    assert logits.abs().max() <= 3.0


def test_states_cover_every_layer_at_every_kept_position(tiny_llm, tokenizer):
    gens = generate_batch(tiny_llm, [tokenizer("Action:")["input_ids"]], max_new_tokens=5)
    gen = gens[0]
    assert gen.states.shape == (max(len(gen.token_ids), 1), tiny_llm.n_layers, tiny_llm.hidden_size)


def test_the_recorder_copies_each_layers_last_position_instead_of_pinning_its_whole_output():
    """A view of ``hidden[:, -1]`` would hold every layer's [B, T, d] output alive through the prefill
    (gigabytes on long prompts); the copy owns just [B, d], with the same values."""
    recorder = _Recorder(n_layers=1)
    hidden = torch.randn(2, 500, 8)
    recorder.keep_layer(0, hidden)
    kept = recorder.current[0]
    assert torch.equal(kept, hidden[:, -1])
    assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()


@pytest.mark.parametrize("model_type,extra", [("llama", {}), ("gemma3_text", {"sliding_window": 4})])
def test_reserved_cache_generates_bit_for_bit_what_the_growing_cache_does(tokenizer, model_type, extra):
    """The reserved cache hands attention the same values in the same shape as transformers' own
    concatenating cache: every token, probability, lens id and state is identical, not just close
    (Gemma's sliding-window layers keep transformers' rolling cache; the window of 4 makes them roll)."""
    llm = make_llm(tokenizer, model_type, **extra)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    reserved = generate_batch(llm, prompts, max_new_tokens=12)
    growing = generate_batch(llm, prompts, max_new_tokens=12, reserve=False)
    for a, b in zip(reserved, growing):
        assert a.token_ids == b.token_ids and a.text == b.text
        np.testing.assert_array_equal(a.token_probs, b.token_probs)
        np.testing.assert_array_equal(a.lens_ids, b.lens_ids)
        np.testing.assert_array_equal(a.states, b.states)


@pytest.mark.parametrize("extra", [{}, {"final_logit_softcapping": 3.0}])
def test_blocked_lens_argmax_is_the_full_vocabulary_argmax(tokenizer, extra):
    llm = make_llm(tokenizer, "gemma3_text", **extra)
    hidden = torch.randn(50, 64, dtype=torch.float64)
    hidden[1] = hidden[0]  # a repeated row
    full = llm.lens_logits(hidden).argmax(dim=-1)
    for block in (7, 1000, 10**6):  # ragged last block, several blocks, one block
        assert torch.equal(llm.lens_argmax(hidden, block=block), full)


def test_blocked_lens_argmax_keeps_the_first_of_tied_maxima(tokenizer):
    llm = make_llm(tokenizer, "llama")
    hidden = torch.randn(1, 64, dtype=torch.float64)
    winner = int(llm.lens_logits(hidden).argmax())
    twin = (winner + 500) % llm.model.get_output_embeddings().weight.shape[0]  # another block of 64
    with torch.no_grad():
        llm.model.get_output_embeddings().weight[twin] = llm.model.get_output_embeddings().weight[winner]
    assert llm.lens_logits(hidden)[0, winner] == llm.lens_logits(hidden)[0, twin]  # an exact tie
    assert int(llm.lens_argmax(hidden, block=64)) == min(winner, twin) == int(llm.lens_logits(hidden).argmax())


def test_the_lens_of_a_bf16_model_takes_the_float32_states_a_replay_keeps(tokenizer):
    llm = make_llm(tokenizer, "llama")
    llm.model.to(torch.bfloat16)
    hidden = torch.randn(20, 64).to(torch.bfloat16)  # states as the model makes them
    assert torch.equal(llm.lens_argmax(hidden.float()), llm.lens_argmax(hidden))
    assert torch.equal(llm.lens_logits(hidden.float()), llm.lens_logits(hidden))  # the engine's replay reads these


def float32_llm(tokenizer, model_type: str = "llama", **extra) -> LLM:
    """A float32 model (what every CPU run uses), the lens screened in bf16 whatever this CPU has."""
    llm = make_llm(tokenizer, model_type, **extra)
    llm.model.float()
    llm.lens_screen = True
    return llm


def test_the_bf16_screened_lens_is_the_float32_argmax(tokenizer):
    llm = float32_llm(tokenizer)
    hidden = torch.randn(600, 64)  # more rows than one screened chunk
    screened = llm.lens_argmax(hidden)
    llm.lens_screen = False
    assert torch.equal(screened, llm.lens_argmax(hidden))
    assert torch.equal(screened, llm.lens_logits(hidden).argmax(dim=-1))


def test_a_vocabulary_of_no_multiple_of_the_screens_group_is_padded_with_tokens_that_never_win():
    weight = torch.rand(1000, 32) + 0.1
    states = -torch.rand(300, 32) - 0.1  # every logit below the padding's zeros
    logits = states @ weight.T
    found = screened_argmax(states, weight, bf16_screen(weight), post=lambda x: x, exact=lambda rows: None, rows=128)
    assert torch.equal(found, logits.argmax(dim=-1))


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_every_bf16_logit_is_within_the_screens_bound_of_its_float32_one(scale):
    """The inequality the screen rests on, |A - L| <= B0 + u|A|, on a vocabulary of 5,000 and 500 rows; and the
    bound is not vacuous (within 100x of the largest error seen: it is a worst case, ~35x on random data)."""
    torch.manual_seed(1)
    weight, states = torch.randn(5000, 576) * 0.05, torch.randn(500, 576) * scale
    low, column_max = bf16_screen(weight)
    approx = (states.bfloat16() @ low[:, :5000]).float()
    error = (approx - states @ weight.T).abs()
    allowed = screen_bound(states, column_max)[:, None] + _OUT_U * approx.abs()
    assert (error <= allowed).all()
    assert allowed.max() < 100 * error.max()


def test_the_screen_finds_the_float32_winner_that_bf16_cannot_tell_from_a_twin(tokenizer):
    """A twin of the winning row with every product 2^-10 smaller rounds to the same bf16 row: bf16 logits tie and
    the earlier twin would win; the float32 logits, computed for both, keep the real winner."""
    llm = float32_llm(tokenizer)
    head = llm.model.get_output_embeddings().weight
    hidden = torch.randn(1, 64)
    with torch.no_grad():
        head.copy_(head.bfloat16().float())  # every row exactly representable in bf16
        winner = int(llm.lens_logits(hidden).argmax())
        twin = winner - 1 if winner else 1
        normed = llm.final_norm(hidden)[0]
        head[twin] = head[winner] * (1 - 2.0**-10 * torch.sign(normed * head[winner]))
    assert torch.equal(head[twin].bfloat16(), head[winner].bfloat16())
    if twin < winner:
        assert int(llm.lens_argmax(hidden)) == winner
    else:  # the twin is later: swap them, so the first of the bf16 tie is the twin
        with torch.no_grad():
            head[[winner, twin]] = head[[twin, winner]]
        assert int(llm.lens_argmax(hidden)) == twin
    llm.lens_screen = False
    assert int(llm.lens_argmax(hidden)) == int(llm.lens_logits(hidden).argmax())


def test_the_screened_lens_keeps_the_first_of_tied_maxima(tokenizer):
    llm = float32_llm(tokenizer)
    hidden = torch.randn(1, 64)
    winner = int(llm.lens_logits(hidden).argmax())
    twin = (winner + 500) % llm.model.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        llm.model.get_output_embeddings().weight[twin] = llm.model.get_output_embeddings().weight[winner]
    assert int(llm.lens_argmax(hidden)) == min(winner, twin)


def test_a_softcap_that_flattens_the_top_logits_into_a_tie_is_computed_in_full(tokenizer):
    """Gemma's softcap rounds every logit above ~9 caps to the cap itself: the first token at the cap wins, which
    the screen's neighbourhood of the largest logit need not hold; such rows go to the full float32 lens."""
    llm = float32_llm(tokenizer, "gemma3_text", final_logit_softcapping=0.5)
    hidden = torch.randn(40, 64) * 50
    flat = llm.lens_logits(hidden)
    assert (flat == flat.max(dim=-1, keepdim=True).values).sum(dim=-1).max() > 1  # ties at the cap
    assert torch.equal(llm.lens_argmax(hidden), flat.argmax(dim=-1))


def test_a_padded_teacher_batch_gives_each_row_what_it_gives_alone(tiny_llm, tokenizer):
    """What a GPU runs (a CPU teacher-forces rows one at a time): left-padded rows of different prompt and reply
    lengths in one forward pass, each row's states and reply log-probabilities as its own pass gives them."""
    from mice_exp.llm.teacher import _forward

    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    replies = [tokenizer(" add_date")["input_ids"], tokenizer(' {"date": "2022-10-14", "days": 90}')["input_ids"], []]
    states, logp = _forward(tiny_llm, prompts, replies, logits=True)
    for prompt, reply, state, lp in zip(prompts, replies, states, logp):
        (alone,), (alone_lp,) = _forward(tiny_llm, [prompt], [reply], logits=True)
        assert state.shape == alone.shape == (max(len(reply), 1), tiny_llm.n_layers, tiny_llm.hidden_size)
        torch.testing.assert_close(state, alone, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(lp, alone_lp, rtol=1e-4, atol=1e-4)
