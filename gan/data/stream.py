"""The batch stream that feeds the training loop: endless, shuffled per epoch, resumable, DDP-sharded."""

import contextlib
import signal
import weakref
from typing import Iterator, Optional

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler, StackDataset

from gan.device import available_cpus
from gan.errors import DataError


def to_unit_range(images: Tensor) -> Tensor:  # uint8 -> float [-1, 1], the range of G's tanh
    return images.float().div_(127.5).sub_(1.0)


class EpochBatchSampler(Sampler[list[int]]):
    """Epoch e's order seeded by (seed, e), so a resume sees the same batches; no last short batch (BatchNorm)."""

    def __init__(self, size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        self.size, self.batch_size, self.seed, self.rank, self.world_size = size, batch_size, seed, rank, world_size
        self.epoch, self.start, self.batches_per_epoch = 0, 0, size // world_size // batch_size

    def __iter__(self) -> Iterator[list[int]]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=gen)[self.rank :: self.world_size]
        for b in range(self.start, self.batches_per_epoch):
            yield order[b * self.batch_size : (b + 1) * self.batch_size].tolist()


class BatchStream:
    """Float batches on the device; num_workers=None: 0 for a tensor, else half the usable cores, 1 to 8."""

    def __init__(
        self,
        images: Tensor | Dataset,
        batch_size: int,
        seed: int,
        device: torch.device,
        num_workers: Optional[int] = 0,
        rank: int = 0,
        world_size: int = 1,
        labels: Optional[Tensor] = None,
    ):
        if len(images) < batch_size * world_size:
            why = f"data.batch_size={batch_size} x {world_size} process(es): an epoch needs one full batch per process"
            raise DataError(f"The training split has {len(images)} images, fewer than {why}. Lower data.batch_size.")
        self.device, self.batch = device, 0  # batches taken in the current epoch
        self.sampler = EpochBatchSampler(len(images), batch_size, seed, rank, world_size)
        in_memory, self.images, self.labels, self.loader = isinstance(images, Tensor), None, None, None
        if num_workers is None:
            num_workers = 0 if in_memory else max(1, min(8, available_cpus() // 2))  # the other half trains
        if in_memory and num_workers == 0:
            self.images = images.to(device)  # uint8: a quarter of float32's size
            self.labels = labels if labels is None else labels.to(device)
        else:
            dataset = images if labels is None else StackDataset(images, labels)  # item i: (images[i], labels[i])
            kwargs = dict(num_workers=num_workers, persistent_workers=num_workers > 0, pin_memory=device.type == "cuda")
            self.loader = DataLoader(dataset, batch_sampler=self.sampler, worker_init_fn=ignore_stop_signals, **kwargs)
            # workers ignore SIGTERM: stopped here, before multiprocessing's exit handler, whose terminate() would hang
            self.close = weakref.finalize(self, stop_workers, self.loader)
        self._batches = self._epoch_iterator()

    def _epoch_iterator(self) -> Iterator[Tensor | tuple[Tensor, Tensor]]:
        if self.loader is not None:
            return iter(self.loader)
        indices = (torch.tensor(index, device=self.device) for index in self.sampler)
        return (self.images[i] if self.labels is None else (self.images[i], self.labels[i]) for i in indices)

    def __next__(self) -> Tensor:
        return self.next_with_labels()[0]

    def next_with_labels(self) -> tuple[Tensor, Optional[Tensor]]:
        try:
            batch = next(self._batches, None)
            if batch is None:  # end of epoch: the next one starts from its first batch
                self.load_state_dict({"epoch": self.sampler.epoch + 1, "batch": 0})
                batch = next(self._batches)
        except DataError as err:  # raised in a worker: its own message, not the pasted traceback
            raise DataError(worker_message(str(err))) from None
        self.batch += 1
        images, labels = batch if isinstance(batch, (tuple, list)) else (batch, None)
        labels = labels if labels is None else labels.to(self.device, non_blocking=True)
        return to_unit_range(images.to(self.device, non_blocking=True)), labels

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.epoch, self.sampler.start = int(state["epoch"]), int(state["batch"])
        self.batch = self.sampler.start
        self._batches = self._epoch_iterator()


def stop_workers(loader: DataLoader) -> None:
    """The loader's orderly shutdown, then SIGKILL for any worker still alive (they ignore SIGTERM)."""
    workers = list(getattr(loader._iterator, "_workers", []))  # private: the persistent workers' iterator, or None
    with contextlib.suppress(Exception):  # None has no _shutdown_workers: nothing to stop
        loader._iterator._shutdown_workers()
    for worker in [w for w in workers if w.is_alive()]:
        worker.kill()
        worker.join(timeout=5)


def ignore_stop_signals(worker_id: int) -> None:
    """A signal to the whole group must not kill a worker before the main process checkpoints (faults.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def worker_message(text: str) -> str:
    last = text.strip().splitlines()[-1] if "Original Traceback" in text else ""
    name, _, message = last.partition(": ")
    return (message if message and "Error" in name else last) or text
