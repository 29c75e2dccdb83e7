# The controller and the node agent share one image: `healer run` and `healer agent`.
# For users with Docker:   docker build -t ghcr.io/healer-project/healer:0.1.0 .
# Without a container engine, `make image` builds the same image from Debian packages
# (healer_dev/image.py, ADR 0011): same packages, same user, same venv, same entrypoint;
# tests/unit/test_image_recipe.py keeps this file and that recipe in step.
# No Slurm client: the chart refuses slurm.driver=scontrol unless slurm.clientInImage=true
# (an image of your own FROM this one, with the scontrol and munge of your Slurm's version).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY healer ./healer
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/*
COPY --from=build /wheels /tmp/wheels
COPY --from=build /usr/local/lib/python3.11/site-packages/pip /tmp/pip/pip
RUN python3 -m venv --without-pip /opt/healer \
    && PYTHONPATH=/tmp/pip /opt/healer/bin/python -m pip install --no-index --no-compile \
       --no-cache-dir --find-links /tmp/wheels healer \
    && rm -rf /tmp/wheels /tmp/pip \
    && echo 'healer:x:65532:65532:healer:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'healer:x:65532:' >> /etc/group
COPY policies/default.yaml /etc/healer/policies/default.yaml
USER 65532:65532
ENV PATH=/opt/healer/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV PYTHONUNBUFFERED=1
ENV PYTHONDONTWRITEBYTECODE=1
EXPOSE 8080
ENTRYPOINT ["/opt/healer/bin/healer"]
CMD ["run", "--policies", "/etc/healer/policies"]
