"""`python -m gan.torchrun [torchrun's options] train.py [overrides]`: torchrun, exiting as the job's first failed
process did (2 for a refusal, 143 after SIGTERM's checkpoint, 128 + N for signal N), where torchrun exits 1 after a
traceback (ChildFailedError) in which a refusal, a signal and a bug read alike."""

import sys
from typing import Optional, Sequence

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

COUNTS = ("auto", "cpu", "gpu", "xpu")  # torchrun's names for "one process per device"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    count = str(args.nproc_per_node)
    if not (count in COUNTS or count.isdigit() and int(count) >= 1):  # torch's own refusal is a bare AssertionError
        why = f"the number of processes per node must be a whole number of 1 or more, or one of {', '.join(COUNTS)}"
        print(f"--nproc_per_node={count}: {why}. Nothing was started.", file=sys.stderr)
        return 2
    try:
        run(args)
    except ChildFailedError as err:  # each process has said why; torchrun's log line names the process
        _, failure = err.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    except SignalException as err:  # torchrun passed the signal on to every process, which checkpointed
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
