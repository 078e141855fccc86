# One image for every Clarion process (api, worker <channel>, relay, db upgrade, topics create),
# built from pyproject.toml: the dependency layer is cached until pyproject.toml changes.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY clarion ./clarion
COPY commands ./commands
COPY core ./core
COPY api ./api
COPY workers ./workers
COPY providers ./providers
COPY schema ./schema
COPY templates ./templates
# Editable: the shipped templates/ live next to the packages, where core.templates looks for them.
RUN pip install --no-deps -e .

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --system --uid 10001 --home-dir /app clarion
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=clarion /app /app
WORKDIR /app
USER clarion
EXPOSE 8000 9100
CMD ["clarion", "api", "--host", "0.0.0.0", "--port", "8000"]
