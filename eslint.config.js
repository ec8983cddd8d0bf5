// Lint: ESLint's recommended rules plus typescript-eslint's, over the TypeScript sources and tests, and no
// import cycle among src/ files (dependencies point one way: the entry point wires, parts are given what
// they need). `import-x/no-cycle` follows static and dynamic imports, resolving the `.js` specifiers of
// the TypeScript sources to their `.ts` files as tsc does.
import js from '@eslint/js'
import { createTypeScriptImportResolver } from 'eslint-import-resolver-typescript'
import { importX } from 'eslint-plugin-import-x'
import globals from 'globals'
import tseslint from 'typescript-eslint'

export default tseslint.config(
  { ignores: ['dist/', 'dist-*/', 'node_modules/', 'data/', 'coverage/', 'bench/results/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    // src/**/*.mjs: the embedded database's worker, plain JavaScript (src/db/pglite-worker.mjs)
    files: ['**/*.ts', 'src/**/*.mjs'],
    languageOptions: { globals: { ...globals.node } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-non-null-assertion': 'off',
      'no-console': ['error', { allow: ['error', 'warn'] }],
      // AbortSignal.any keeps every signal it made on the list of each signal it was given, for good: on
      // Node 20 a long-lived one (a loop's stop signal) held 70 bytes more per call after a full GC, and on
      // Node 22 a call took 120 µs and more once 100,000 had been made (nodejs/node#54614). anySignal
      // listens instead, and its clear() leaves nothing behind
      'no-restricted-properties': [
        'error',
        { object: 'AbortSignal', property: 'any', message: "use anySignal from 'any-signal', and clear() it when done" },
      ],
    },
  },
  {
    files: ['src/**/*.ts'],
    plugins: { 'import-x': importX },
    settings: {
      // which files the rule parses (TypeScript) and how it resolves a specifier to one
      'import-x/extensions': ['.ts', '.js'],
      'import-x/parsers': { '@typescript-eslint/parser': ['.ts'] },
      'import-x/resolver-next': [createTypeScriptImportResolver({ project: 'tsconfig.json' })],
    },
    rules: { 'import-x/no-cycle': ['error', { ignoreExternal: true }] },
  },
  {
    // the CLI, the benchmarks and the demo talk to a terminal
    files: ['src/cli/**', 'src/cli.ts', 'bench/**', 'src/demo/**'],
    rules: { 'no-console': 'off' },
  },
)
