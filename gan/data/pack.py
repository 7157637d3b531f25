"""A dataset decoded and resized once into OUT_FOLDER/pack.pt (as StyleGAN2-ADA's dataset_tool), for data=packed."""

import argparse
import dataclasses
import hashlib
import logging
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from gan.checkpoint import save_atomically
from gan.config import DataConfig
from gan.data.sources import PACK_FILE, PACK_FORMAT, load_dataset
from gan.errors import ConfigError, UserError, environment_error

log = logging.getLogger(__name__)


def write_pack(data: DataConfig, folder: Path) -> Path:
    """folder/pack.pt from `data`'s two splits, decoded into memory once; written whole or not at all."""
    if data.name == "packed":
        raise ConfigError("data=packed is already a pack: name the dataset to pack (data=folder, data=celeba, ...).")
    started, data = time.perf_counter(), dataclasses.replace(data, limit=0, in_memory=True)
    splits = {"train": load_dataset(data, train=True), "held_out": load_dataset(data, train=False)}
    settings = {key: str(value) for key, value in dataclasses.asdict(data).items()}  # enums and paths as text
    settings.update(image_size=data.image_size, channels=data.channels, root=str(Path(data.root).resolve()))
    content = hashlib.sha256()  # of the pixels and labels: what a run trained from, whatever folder holds it
    for tensor in [t for split in splits.values() for t in (split.images, split.labels)]:
        content.update(tensor.contiguous().numpy())
    num_classes = splits["train"].num_classes
    pack = dict(format=PACK_FORMAT, settings=settings, content=content.hexdigest(), num_classes=num_classes)
    pack.update({name: {"images": split.images, "labels": split.labels} for name, split in splits.items()})
    save_atomically(pack, path := folder / PACK_FILE)
    counts = ", ".join(f"{len(split.labels)} {name}" for name, split in splits.items())
    log.info("Packed data=%s (%s images) into %s in %.1f s", data.name, counts, path, time.perf_counter() - started)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m gan.data.pack OUT_FOLDER [data overrides]`: the exit code (0 after --help; 2: bad input; 130)."""
    from gan.api import compose_config  # the training configs, composed and checked as train.py does
    from gan.launch import override_key

    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")  # unless set up
    prog = "dcgan-pack" if Path(sys.argv[0]).name == "dcgan-pack" else "python -m gan.data.pack"  # as installed
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("out_folder", type=Path, help="the folder pack.pt is written to")
    parser.add_argument("overrides", nargs="*", metavar="data.KEY=VALUE", help="train.py's data overrides: data=NAME")
    try:
        args = parser.parse_args(argv)
        if "=" in str(args.out_folder):
            parser.error(f"the first argument is OUT_FOLDER, not an override ({args.out_folder})")
    except SystemExit as stop:  # argparse's own: 0 after --help, 2 for bad arguments (its usage said why)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        if others := [o for o in args.overrides if override_key(o).split(".")[0] != "data"]:
            why = "a pack holds images, so it takes the data settings only (data=NAME, data.KEY=VALUE)"
            raise ConfigError(f"{' '.join(others)}: {why}. Nothing was written: give them to train.py with the pack.")
        write_pack(compose_config(*args.overrides).data, args.out_folder)
    except (UserError, OSError) as err:  # OSError: a full disk, a read-only folder; no partial file is left
        log.error("%s", environment_error(err, then="pack again.") if isinstance(err, OSError) else err)
        return 2
    except KeyboardInterrupt:
        log.error("Interrupted: no pack was written (a partial file is removed). Pack again to write it.")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
