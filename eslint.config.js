// Lint: ESLint's recommended rules plus typescript-eslint's, over the TypeScript sources and tests.
import js from '@eslint/js'
import globals from 'globals'
import tseslint from 'typescript-eslint'

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'data/', 'coverage/', 'bench/results/'] },
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
    // the CLI, the benchmarks and the demo talk to a terminal
    files: ['src/cli/**', 'src/cli.ts', 'bench/**', 'src/demo/**'],
    rules: { 'no-console': 'off' },
  },
)
