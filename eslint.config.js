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
    files: ['**/*.ts'],
    languageOptions: { globals: { ...globals.node } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-non-null-assertion': 'off',
      'no-console': ['error', { allow: ['error', 'warn'] }],
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
