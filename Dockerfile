# The controller and the node agent share one image: `healer run` and `healer agent`.
#   docker build -t healer:0.1.0 .
# (This repository's CI has no container engine; the image is not built by `make test`.)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY healer ./healer
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin healer
COPY policies/default.yaml /etc/healer/policies/default.yaml
USER 65532:65532
ENV PYTHONUNBUFFERED=1
EXPOSE 8080
ENTRYPOINT ["healer"]
CMD ["run", "--policies", "/etc/healer/policies"]
