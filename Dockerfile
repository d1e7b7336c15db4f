# kvgate as a container image, for CI jobs and Kubernetes Jobs that gate an endpoint (--endpoint,
# --isvc) or start the profile's server on the runner's Docker (--launch docker, with the Docker
# socket mounted). No embedded vLLM inside: build the checkout's ./bootstrap for that.
#
#   docker build -t kvgate .                                     # base python:3.11-slim
#   docker build --build-arg BASE=registry.example/python:3.11 -t kvgate .
#   docker run --rm kvgate --profile llama70b-tp4 -m fit         # the arguments are pytest's
#
# BASE must have Python >= 3.10 with pip (python:3.11-slim has). PIP_ARGS goes to pip install
# (kvgate's own test builds on a local base that already holds the dependencies: --no-deps ...).
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG PIP_ARGS=""
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /kvgate
COPY pyproject.toml README.md conftest.py ./
COPY src ./src
COPY suites ./suites
COPY fixtures ./fixtures
COPY profiles ./profiles
# editable: profiles/ and suites/ are read from /kvgate, as in a checkout
RUN python3 -m pip install --no-cache-dir ${PIP_ARGS} -e . && mkdir -p reports
# reports/ is where summary.json, junit.xml and allure-results land: mount a volume there
ENTRYPOINT ["python3", "-m", "pytest", "-p", "no:cacheprovider"]
CMD ["--help"]
