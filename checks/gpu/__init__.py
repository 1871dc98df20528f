"""The GPU check (`make gpu-check`, `python -m checks.gpu`), one module per concern:

- `carry`     here: `make gpu-wheels` fills .gpu/ (the wheels the GPU machine lacks, airbench's
              wheel built from its sdist, the CIFAR-10 tarball) and checks the 64 MiB that travels;
- `plan`      the steps in their order of value, each with its timeout, within the budget;
- `runner`    one step in its own process group, its timeout, its row;
- `summaries` what each step's output says (its row's key numbers, its report section);
- `machine`   there: the steps' environment, installing the wheels, extracting CIFAR-10,
              provenance;
- `report`    the whole check and OUT/gpu_check.md, rewritten after every step;
- `cifar`     CIFAR-10 from the shared JPEGs as uint8 tensors (and airbench's train.pt/test.pt);
- `peer`      airbench94, the `fast` step's peer, run by its own code on a GPU or the CPU;
- `records`   the one-line JSON results a measuring step prints and its summary reads;
- `paper`, `fast`, `syncs`  the measuring steps, each a script (`python -m checks.gpu.paper`);
- `peer_airbench`  the same peer on the CPU at full length, seed by seed (about an hour).

`__main__` is the command line.
"""
