"""``python -m trainer.models``: every preset with its parameter count, one per line (counted on the meta device)."""
import argparse

from trainer.log import print0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.models", description=__doc__)
    parser.parse_args(argv)
    from trainer.models.presets import PRESET_ROWS, preset_parameters

    width = max(map(len, PRESET_ROWS))
    for name, row in PRESET_ROWS.items():
        cfg = row.config
        shape = f"L={cfg.num_layers} H={cfg.hidden_size} A={cfg.num_heads} E={cfg.emb_size} sharing={cfg.sharing}"
        print0(f"{name:<{width}}  {preset_parameters(name):>13,d} parameters  (paper {row.paper:<18}) "
               f"{cfg.family:<8} {shape}  heads: {'+'.join(row.heads)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
