"""``python -m gpupool.cli``: the ``gpupool`` command line."""

from gpupool.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
