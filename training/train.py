"""Train diffgemma-tiny from scratch with DiffusionGemma's objective, on CPU or CUDA.

Per step, for a batch of (prefix, clean canvas) examples (`training.data`):
1. the causal encoder reads the prefix (prompt and earlier blocks), filling the KV cache; its hidden states also give
   a next-token loss, so the same weights decode autoregressively (the honest same-weights AR baseline);
2. uniform-state corruption: each canvas token is replaced by a uniformly random token with probability t,
   t = u ** noise_power with u ~ U(0, 1) per example (there is no mask token, as in the released model);
   noise_power > 1 skews training to low noise, where a sampler's last steps decide what a canvas settles on;
3. self-conditioning: a first decoder pass without gradient gives logits that a second pass receives as
   `self_conditioning_logits`, enabled for a random half of the examples through `self_conditioning_mask`;
4. loss = cross-entropy of the second pass on the clean canvas + `encoder_loss_weight` x encoder next-token loss.
The network is transformers' `DiffusionGemmaForBlockDiffusion`; nothing here re-implements it.

Run: `python -m training.train --out data/run` (resumes from `data/run/checkpoint` when present; `--init FOLDER`
starts from trained weights, e.g. to continue v1 with a new objective).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion, DynamicCache

from .data import Batch, ExampleSampler
from .model_config import PAD_ID, tiny_config


def softcapped_logits(model: DiffusionGemmaForBlockDiffusion, hidden: torch.Tensor) -> torch.Tensor:
    """LM head + final soft-capping, as `DiffusionGemmaForBlockDiffusion.forward` applies to decoder states.
    Shapes: `[batch, seq, hidden]` -> `[batch, seq, vocab]` (float32)."""
    cap = model.final_logit_softcapping
    return torch.tanh(model.lm_head(hidden).float() / cap) * cap


def corrupt(
    canvas: torch.LongTensor, vocab_size: int, generator: torch.Generator, noise_power: float = 1.0
) -> torch.LongTensor:
    """Uniform-state corruption: with probability t = u ** noise_power, u ~ U(0,1) (one t per row), replace each token
    by a uniform one. Shape `[batch, canvas_length]` in and out."""
    t = torch.rand(canvas.shape[0], 1, generator=generator, device=canvas.device) ** noise_power
    replace = torch.rand(canvas.shape, generator=generator, device=canvas.device) < t
    noise = torch.randint(0, vocab_size, canvas.shape, generator=generator, device=canvas.device)
    return torch.where(replace, noise, canvas)


def losses(model, batch: Batch, noisy: torch.LongTensor, self_conditioning_mask: torch.BoolTensor | None,
           ignore_pad: bool = False):
    """Return (diffusion CE, encoder next-token CE) for one batch; see the module docstring for the recipe.

    `noisy` is the corrupted canvas `[batch, canvas_length]`; `self_conditioning_mask` `[batch]` (None: no
    self-conditioning pass at all, used by evaluation); `ignore_pad` leaves `<pad>` targets out of the diffusion CE
    (evaluation scores text positions only, which v1 and v2 share)."""
    prefix_len = batch.prefix.shape[1]
    canvas_length = batch.canvas.shape[1]
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    encoder_out = model.model.encoder(input_ids=batch.prefix, attention_mask=batch.prefix_mask, past_key_values=cache)
    decoder_mask = F.pad(batch.prefix_mask, (0, canvas_length), value=1)
    positions = torch.arange(prefix_len, prefix_len + canvas_length, device=noisy.device).unsqueeze(0)
    decoder_kwargs = dict(
        past_key_values=cache, decoder_input_ids=noisy,
        decoder_attention_mask=decoder_mask, decoder_position_ids=positions,
    )
    self_conditioning_logits = None
    if self_conditioning_mask is not None:
        with torch.no_grad():
            self_conditioning_logits = model(**decoder_kwargs).logits
    logits = model(
        **decoder_kwargs, self_conditioning_logits=self_conditioning_logits,
        self_conditioning_mask=self_conditioning_mask,
    ).logits
    ignore_index = PAD_ID if ignore_pad else -100
    diffusion_ce = F.cross_entropy(logits.flatten(0, 1), batch.canvas.flatten(), ignore_index=ignore_index)

    encoder_logits = softcapped_logits(model, encoder_out.last_hidden_state)
    targets = torch.cat([batch.prefix[:, 1:], batch.canvas[:, :1]], dim=1)
    valid = torch.cat([batch.prefix_mask[:, 1:], torch.ones_like(batch.prefix_mask[:, :1])], dim=1).bool()
    encoder_ce = F.cross_entropy(encoder_logits[valid], targets[valid])
    return diffusion_ce, encoder_ce


def learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of `peak`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def save_checkpoint(model, optimizer, step: int, sampler: ExampleSampler, generator: torch.Generator, path: Path):
    """Write weights (safetensors) and trainer state atomically to `path`."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    torch.save(
        {"optimizer": optimizer.state_dict(), "step": step, "sampler_rng": sampler.rng.getstate(),
         "torch_rng": generator.get_state()},
        tmp / "trainer_state.pt",
    )
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    parser.add_argument("--out", type=Path, default=Path("data/run"))
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--canvas-length", type=int, default=64)
    parser.add_argument("--max-prefix", type=int, default=192)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--encoder-loss-weight", type=float, default=0.5)
    parser.add_argument("--noise-power", type=float, default=1.0, help="t = u ** power; > 1 favours low noise")
    parser.add_argument("--after-end", choices=("end", "pad"), default="end", help="canvas targets after the text ends")
    parser.add_argument("--minutes", type=float, default=0.0, help="stop (with a checkpoint) after this wall time")
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", type=Path, help="start from these weights (a model folder) instead of random ones")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (CPUs with AVX512-BF16/AMX, or CUDA)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    sampler = ExampleSampler(
        tokenizer, args.corpus / "train.jsonl", args.canvas_length, args.max_prefix, args.seed, args.after_end
    )
    generator = torch.Generator(device=device).manual_seed(args.seed)
    checkpoint = args.out / "checkpoint"
    args.out.mkdir(parents=True, exist_ok=True)

    if checkpoint.exists():
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(checkpoint).to(device)
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        start_step = state["step"]
    elif args.init:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.init).to(device)
        state, start_step = None, 0
    else:
        config = tiny_config(len(tokenizer), args.canvas_length, args.hidden_size, args.layers)
        model = DiffusionGemmaForBlockDiffusion(config).to(device)
        state, start_step = None, 0
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        sampler.rng.setstate(state["sampler_rng"])
        generator.set_state(state["torch_rng"])
    n_params = sum(p.numel() for p in model.parameters())
    (args.out / "train_args.json").write_text(json.dumps({**vars(args), "parameters": n_params}, default=str, indent=1))
    print(f"{n_params / 1e6:.2f}M parameters, device {device}, starting at step {start_step}/{args.steps}")

    log_path = args.out / "log.csv"
    if start_step and log_path.exists():  # drop rows logged after the checkpoint we resume from
        rows = log_path.read_text().splitlines()
        kept = [r for r in rows if not r[:1].isdigit() or int(r.split(",")[0]) <= start_step]
        log_path.write_text("\n".join(kept) + "\n")
    with open(log_path, "a", newline="") as log_file:
        log = csv.writer(log_file)
        if start_step == 0:
            log.writerow(["step", "seconds", "lr", "diffusion_ce", "encoder_ce", "tokens_per_second"])
        started = time.perf_counter()
        progress = tqdm(range(start_step, args.steps), initial=start_step, total=args.steps, mininterval=5)
        for step in progress:
            lr = learning_rate(step, args.steps, args.lr, args.warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            batch = sampler.batch(args.batch_size)
            batch = Batch(*(x.to(device) for x in (batch.prefix, batch.prefix_mask, batch.canvas)))
            noisy = corrupt(batch.canvas, model.config.text_config.vocab_size, generator, args.noise_power)
            sc_mask = torch.rand(args.batch_size, generator=generator, device=device) < 0.5
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                diffusion_ce, encoder_ce = losses(model, batch, noisy, sc_mask)
            loss = diffusion_ce + args.encoder_loss_weight * encoder_ce
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            tokens = batch.prefix_mask.sum().item() + batch.canvas.numel()
            tps = tokens / (time.perf_counter() - t0)
            log.writerow([step + 1, f"{time.perf_counter() - started:.1f}", f"{lr:.2e}",
                          f"{diffusion_ce.item():.4f}", f"{encoder_ce.item():.4f}", f"{tps:.0f}"])
            progress.set_postfix(diff=f"{diffusion_ce.item():.3f}", enc=f"{encoder_ce.item():.3f}", tps=f"{tps:.0f}")
            out_of_time = args.minutes and time.perf_counter() - started > 60 * args.minutes
            if (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps or out_of_time:
                log_file.flush()
                save_checkpoint(model, optimizer, step + 1, sampler, generator, checkpoint)
            if out_of_time:
                break
    print(f"done: {checkpoint}")


if __name__ == "__main__":
    main()
