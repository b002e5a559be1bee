#!/usr/bin/env python3
"""Fixtures for the interchange with the official ELM code (tests/official_elm.rs; run once, CI
never runs it). Everything model-related goes through the official repository's own classes.

Official -> ours: a tiny random Qwen2 base model (HF), a LoRA checkpoint in the official
stage-1 format (`layers.{i}.attention.lora_q.linear_A.weight`, ... on the Meta-permuted q/k
layout), and an ELM training checkpoint made with the official training class
(`elm.model_elm.Transformer`, its `prune_interval_replace_module` perturbed as training would,
saved as `{'model': trainable weights}` with `model_args.json`) go through the official
`hf_infer/convert_to_hf.py`; the integrated model it writes is run by the official
`Qwen2ELMForCausalLM` for reference logits and greedy tokens.

Ours -> official: `--check-export DIR` loads a directory that `elm export-official` wrote with
`Qwen2ELMForCausalLM.from_pretrained` and prints its logits and greedy tokens as JSON.

Patches to the official code (applied to a copy, listed in PATCHES below): convert_to_hf.py
returns before saving (`exit(0)`) and sets CUDA as the default tensor type.

Usage:
  python3 scripts/ref_official_elm.py OFFICIAL_REPO OUT_DIR         (writes the fixture)
  python3 scripts/ref_official_elm.py OFFICIAL_REPO --check-export DIR
  python3 scripts/ref_official_elm.py OFFICIAL_REPO --generate DIR "PROMPT" N   (greedy token ids)
  python3 scripts/ref_official_elm.py OFFICIAL_REPO --convert BASE_HF_DIR LORA.pt TRAINABLE_WEIGHTS.pt \
      MODEL_ARGS.json OUT_DIR      (a training run of the official code -> the integrated directory)
Needs: pip install torch transformers==4.57.* safetensors fire tokenizers
"""
import json
import os
import shutil
import sys
import tempfile

import torch

PATCHES = [
    ("hf_infer/convert_to_hf.py", "    exit(0)\n", ""),
    ("hf_infer/convert_to_hf.py", "torch.set_default_tensor_type(torch.cuda.FloatTensor)",
     "torch.set_default_dtype(torch.float32)"),
]
TOKENS = [5, 17, 42, 99, 3, 250, 7, 64, 128, 31, 8, 200]
NEW_TOKENS = 8


def official_copy(repo):
    """A patched copy of the official repository, on sys.path as its scripts expect."""
    work = tempfile.mkdtemp(prefix="elm-official-")
    shutil.copytree(repo, os.path.join(work, "ELM"), ignore=shutil.ignore_patterns(".git", "datasets"))
    root = os.path.join(work, "ELM")
    for rel, old, new in PATCHES:
        path = os.path.join(root, rel)
        text = open(path).read()
        assert old in text, (rel, old)
        open(path, "w").write(text.replace(old, new))
    sys.path[:0] = [root, os.path.join(root, "hf_infer")]
    return root


def tiny_tokenizer(vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(["def add(a, b):\n    return a + b\n", "The answer is: 42\n"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def reference_outputs(model):
    tokens = [t % model.config.vocab_size for t in TOKENS]
    ids = torch.tensor([tokens])
    with torch.no_grad():
        # The official port needs a cache object even for one forward (None crashes).
        from transformers import DynamicCache
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0]
        # An explicit mask: generate() would otherwise mask input tokens equal to pad_token_id.
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return {"tokens": tokens, "logits": logits.tolist(), "greedy": out[0, len(tokens):].tolist()}


def make_fixture(repo, out):
    official_copy(repo)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from elm.model_elm import ModelArgs, Transformer as ElmTrainingModel
    import convert_to_hf
    from modeling_qwen.modeling_qwen2_elm import Qwen2ELMForCausalLM

    torch.manual_seed(0)
    work = tempfile.mkdtemp(prefix="elm-official-fixture-")
    tok = tiny_tokenizer(300)
    vocab = len(tok)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=7,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      use_sliding_window=False, eos_token_id=0, bos_token_id=0)
    base = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in base.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))  # non-trivial biases and norms
    base_dir = os.path.join(work, "base")
    base.save_pretrained(base_dir, safe_serialization=True)
    tok.save_pretrained(base_dir)

    # Stage-1 LoRA in the official format: A [r, in], B [out, r], q/k on the Meta layout.
    r, d, ffn = 4, cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    shapes = {"attention.lora_q": (d, d), "attention.lora_k": (kv, d), "attention.lora_v": (kv, d),
              "attention.lora_o": (d, d), "feed_forward.lora_1": (ffn, d), "feed_forward.lora_3": (ffn, d),
              "feed_forward.lora_2": (d, ffn)}
    lora = {}
    for i in range(cfg.num_hidden_layers):
        for name, (o, n) in shapes.items():
            lora[f"layers.{i}.{name}.linear_A.weight"] = 0.05 * torch.randn(r, n)
            lora[f"layers.{i}.{name}.linear_B.weight"] = 0.05 * torch.randn(o, r)
    lora_path = os.path.join(work, "lora.pt")
    torch.save({"model": lora}, lora_path)

    # ELM training checkpoint from the official training class, start 2, M = 3.
    start, m = 2, 3
    args = ModelArgs(model_type="qwen", dim=d, n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, vocab_size=vocab, intermediate_size=ffn,
                     norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, max_seq_len=32,
                     prune_interval_start_layer=start, prune_interval_len=m)
    student = ElmTrainingModel(args)
    with torch.no_grad():
        for p in student.prune_interval_replace_module.parameters():
            p.add_(0.05 * torch.randn_like(p))  # "trained": W_z, W_x, bias and block all moved
    trainable = {k: v for k, v in student.state_dict().items() if "prune_interval" in k}
    ckpt_path = os.path.join(work, "trainable_weights.pt")
    torch.save({"epoch": 0, "model": trainable}, ckpt_path)
    args_path = os.path.join(work, "model_args.json")
    json.dump(vars(args), open(args_path, "w"))

    integrated = os.path.join(out, "integrated")
    shutil.rmtree(integrated, ignore_errors=True)
    convert_to_hf.convert(base_dir, lora_path, ckpt_path, args_path, integrated)
    model = Qwen2ELMForCausalLM.from_pretrained(integrated, torch_dtype=torch.float32).eval()
    ref = reference_outputs(model)
    ref["official_commit"] = "ea7a054"
    ref["patches"] = [f"{f}: {o.strip()!r} -> {n.strip()!r}" for f, o, n in PATCHES]
    ref["start"], ref["num_replaced"] = start, m
    ref["max_iters"] = model.config.fixed_point_layer_interval_len
    ref["exit_threshold"] = model.config.fixed_point_exit_threshold
    json.dump(ref, open(os.path.join(out, "official_reference.json"), "w"))
    print(json.dumps({k: ref[k] for k in ("greedy", "start", "num_replaced", "max_iters", "exit_threshold")}))


def check_export(repo, path):
    official_copy(repo)
    from modeling_qwen.modeling_qwen2_elm import Qwen2ELMForCausalLM
    model = Qwen2ELMForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    print(json.dumps(reference_outputs(model)))


def generate(repo, path, prompt, n):
    """Greedy continuation of `prompt` (raw text) by the official class, as token ids."""
    official_copy(repo)
    from transformers import AutoTokenizer
    from modeling_qwen.modeling_qwen2_elm import Qwen2ELMForCausalLM
    model = Qwen2ELMForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(path)(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    print(json.dumps({"prompt_tokens": ids[0].tolist(), "greedy": out[0, ids.shape[1]:].tolist()}))


def convert(repo, base, lora, ckpt, model_args, out):
    """The official converter (patched as PATCHES lists) on a real training run's outputs."""
    official_copy(repo)
    import convert_to_hf
    convert_to_hf.convert(base, lora, ckpt, model_args, out)


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[2] == "--convert":
        convert(sys.argv[1], *sys.argv[3:8])
    elif len(sys.argv) == 4 and sys.argv[2] == "--check-export":
        check_export(sys.argv[1], sys.argv[3])
    elif len(sys.argv) == 6 and sys.argv[2] == "--generate":
        generate(sys.argv[1], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif len(sys.argv) == 3:
        make_fixture(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
