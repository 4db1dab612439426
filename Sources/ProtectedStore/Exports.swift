// An app imports ProtectedStore alone and gets the core's public types (ProtectionClass, Passcode,
// ProtectedStoreError, ...) with it, as before the split.
@_exported import ProtectedStoreCore
