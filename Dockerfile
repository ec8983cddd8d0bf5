# syntax=docker/dockerfile:1
# Build stage: compile TypeScript to dist/.
FROM node:24-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY migrations ./migrations
RUN npm run build

# Runtime stage: production dependencies and the compiled code only, as the unprivileged `node` user.
FROM node:24-slim AS runtime
# a smaller young generation, and an old-space ceiling of 512 MB: with a ceiling that low V8 lets the old
# generation grow at most about 1.4 times its live size between full collections instead of 4 times, and
# under load the peak RSS stayed at 150-165 MB instead of 211-270 MB (README, "Memory"). The live heap is
# 50-65 MB; the bodies in flight are bounded by MAX_INFLIGHT_BODY_BYTES (16 MB)
ENV NODE_ENV=production \
    NODE_OPTIONS="--max-semi-space-size=8 --max-old-space-size=512" \
    HOST=0.0.0.0 \
    PORT=3000 \
    ADMIN_HOST=127.0.0.1 \
    ADMIN_PORT=3001 \
    DATA_DIR=/app/data
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY LICENSE ./
RUN mkdir -p /app/data && chown node:node /app/data
USER node
# the public listener; the operator listener (ADMIN_PORT) stays on 127.0.0.1 unless ADMIN_HOST says otherwise
EXPOSE 3000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.PORT || 3000) + '/healthz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
CMD ["node", "dist/src/cli.js", "serve"]
