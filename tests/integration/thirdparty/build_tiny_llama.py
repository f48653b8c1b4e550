"""A tiny random-weight Llama and its tokenizer, written into a Hugging Face cache as if downloaded,
so that `transformers serve REPO_ID` loads it offline and lists it in GET /v1/models (which lists the
cache's causal LMs: transformers/cli/serving/model_manager.py:484-545, get_gen_models).

    python build_tiny_llama.py HF_HOME REPO_ID      # run by the server venv's python (torch, transformers)

Nothing comes from a hub: the tokenizer is a byte-level BPE trained here on a few lines (every
byte of any prompt encodes), the weights are random (seeded); the text it generates is noise, the
serving path (HTTP, tokenizer, chat template, generate, streaming) is real. Prints one JSON line:
the snapshot directory and the model's sizes.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Benchmark the server at one concurrency level, then the next.",
    "Every request streams its tokens back as server-sent events.",
    "A tiny random model: the text is noise, the serving path is real.",
    "user: hello there, assistant: hello, how can I help you today?",
]
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")
# A cache snapshot is named by a commit hash; this one is fixed (nothing was downloaded).
REVISION = hashlib.sha1(b"servelab tiny random llama 1").hexdigest()


def build(hf_home: str, repo_id: str) -> dict:
    started = time.monotonic()
    repo_dir = os.path.join(hf_home, "hub", "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo_dir, "snapshots", REVISION)
    os.makedirs(snapshot, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=384, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(snapshot)

    config = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=fast.bos_token_id,
                                               eos_token_id=fast.eos_token_id,
                                               pad_token_id=fast.pad_token_id)
    model.save_pretrained(snapshot)

    # refs/main -> the snapshot, as a download leaves it (scan_cache_dir and from_pretrained's
    # offline lookup read it).
    os.makedirs(os.path.join(repo_dir, "refs"), exist_ok=True)
    with open(os.path.join(repo_dir, "refs", "main"), "w", encoding="utf-8") as fh:
        fh.write(REVISION)
    return {"snapshot": snapshot, "vocab": len(fast), "layers": config.num_hidden_layers,
            "hidden": config.hidden_size,
            "params": sum(p.numel() for p in model.parameters()),
            "seconds": round(time.monotonic() - started, 2)}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: build_tiny_llama.py HF_HOME REPO_ID")
    print(json.dumps(build(sys.argv[1], sys.argv[2])))
