import CSQLite
import Foundation
import Notes
import ProtectedStore
import ProtectedStoreTesting

// What the container costs SQLite: the notes store against the same SQL on SQLite's own unix VFS, in one run, in
// the same folder, with the same pragmas; then what the testing kit's everyPowerCut costs per state of a notes add and
// of a small save, beside a plain reboot and the same check. Usage: notes-bench [--notes N] [--rounds R] [--power-cut-states S]

func option(_ name: String, default value: Int) -> Int {
    guard let index = CommandLine.arguments.firstIndex(of: name), index + 1 < CommandLine.arguments.count,
          let parsed = Int(CommandLine.arguments[index + 1]), parsed > 0 else { return value }
    return parsed
}
let noteCount = option("--notes", default: 300)
let rounds = option("--rounds", default: 3)
let powerCutStates = option("--power-cut-states", default: 200)

/// The same statements through SQLite's default VFS on a plain file: the baseline.
final class PlainNotes {
    private var db: OpaquePointer?
    let path: String

    init(path: String) {
        self.path = path
        open()
    }

    func open() {
        precondition(sqlite3_open(path, &db) == SQLITE_OK)
        exec("""
            PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE; PRAGMA synchronous = EXTRA; PRAGMA temp_store = MEMORY;
            CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL, created REAL NOT NULL, imported_from TEXT);
            """)
    }

    func close() { sqlite3_close(db) }

    func exec(_ sql: String) { precondition(sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK, String(cString: sqlite3_errmsg(db))) }

    func add(title: String, body: String) {
        exec("BEGIN IMMEDIATE")
        var statement: OpaquePointer?
        sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO notes (id, title, body, created, imported_from) VALUES (?, ?, ?, ?, NULL)", -1, &statement, nil)
        let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
        sqlite3_bind_text(statement, 1, UUID().uuidString, -1, transient)
        sqlite3_bind_text(statement, 2, title, -1, transient)
        sqlite3_bind_text(statement, 3, body, -1, transient)
        sqlite3_bind_double(statement, 4, Date().timeIntervalSinceReferenceDate)
        precondition(sqlite3_step(statement) == SQLITE_DONE)
        sqlite3_finalize(statement)
        exec("COMMIT")
    }

    /// Every note, decoded into the store's own `Note` values and collected as `NotesStore.notes()` does, so both
    /// sides do the same work apart from the VFS.
    func notes() -> [Note] {
        var statement: OpaquePointer?
        sqlite3_prepare_v2(db, "SELECT id, title, body, created, imported_from FROM notes ORDER BY created, id", -1, &statement, nil)
        var notes: [Note] = []
        while sqlite3_step(statement) == SQLITE_ROW {
            let id = UUID(uuidString: String(cString: sqlite3_column_text(statement, 0)))!
            let title = String(cString: sqlite3_column_text(statement, 1)), text = String(cString: sqlite3_column_text(statement, 2))
            let created = Date(timeIntervalSinceReferenceDate: sqlite3_column_double(statement, 3))
            let importedFrom = sqlite3_column_text(statement, 4).map { String(cString: $0) }
            notes.append(Note(id: id, title: title, body: text, created: created, importedFrom: importedFrom))
        }
        sqlite3_finalize(statement)
        return notes
    }
}

func seconds(_ body: () throws -> Void) rethrows -> Double {
    let start = DispatchTime.now().uptimeNanoseconds
    try body()
    return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
}

func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

let scratch = (NSTemporaryDirectory() as NSString).appendingPathComponent("notes-bench-\(UUID().uuidString)")
try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(atPath: scratch) }
let device = try Device.create(root: "\(scratch)/root", deviceSecretPath: "\(scratch)/device.secret", passcode: try Passcode("bench"), kdf: .fast,
                               notificationCenter: NotificationCenter())
let container = try device.createContainer(bundleIdentifier: "com.example.notes")
let store = try NotesStore(container: container)
let plain = PlainNotes(path: "\(scratch)/plain.sqlite")
let body = String(repeating: "a note of ordinary length. ", count: 8)

var rows: [(String, [Double], [Double])] = [("add \(noteCount) notes, one transaction each", [], []), ("read all notes x20", [], []),
                                            ("close and reopen x100", [], [])]
for round in 0..<rounds {
    // Alternate which goes first, so neither always meets a warmer disk cache.
    let storeFirst = round % 2 == 1
    func measure(_ index: Int, plain plainWork: () throws -> Void, store storeWork: () throws -> Void) throws {
        if storeFirst { rows[index].2.append(try seconds(storeWork)); rows[index].1.append(try seconds(plainWork)) }
        else { rows[index].1.append(try seconds(plainWork)); rows[index].2.append(try seconds(storeWork)) }
    }
    try measure(0, plain: { for index in 0..<noteCount { plain.add(title: "n\(index)", body: body) } },
                store: { for index in 0..<noteCount { try store.add(title: "n\(index)", body: body) } })
    try measure(1, plain: { for _ in 0..<20 { precondition(!plain.notes().isEmpty) } },
                store: { for _ in 0..<20 { let notes = try store.notes(); precondition(!notes.isEmpty) } })
    // What a lock and an unlock cost the app: its database closed and opened again (the lock's own work aside).
    try measure(2, plain: { for _ in 0..<100 { plain.close(); plain.open() } },
                store: { for _ in 0..<100 { store.protectedDataWillBecomeUnavailable(device); store.protectedDataDidBecomeAvailable(device) } })
}
plain.close()
store.close()

print("notes-bench: \(noteCount) notes, \(rounds) rounds, median seconds; synchronous = EXTRA on both (DELETE mode: the journal's removal synced) on \(scratch)")
print("operation".padding(toLength: 44, withPad: " ", startingAt: 0) + "plain SQLite   notes store   ratio")
for (name, plainTimes, storeTimes) in rows {
    let (p, s) = (median(plainTimes), median(storeTimes))
    print(name.padding(toLength: 44, withPad: " ", startingAt: 0) + String(format: "%10.3f   %11.3f   %5.2f", p, s, s / p))
}

// everyPowerCut's cost per state: each state is rebuilt as a folder, brought up before first unlock, and checked; the
// baseline is the same bring-up and check after a plain reboot, without the simulator.
func measurePowerCuts(_ device: TestDevice, during operation: () throws -> Void,
                      check: (TestDevice) async throws -> Void) async throws -> (summary: PowerCutSummary, perState: Double, reboot: Double) {
    var checked = 0
    let start = DispatchTime.now().uptimeNanoseconds
    let summary = try await device.everyPowerCut(maxStates: powerCutStates, seed: 1, during: operation, afterReboot: { rebooted in
        try await check(rebooted)
        checked += 1
    })
    let perState = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6 / Double(max(1, checked))
    var reboots: [Double] = []
    for _ in 0..<20 {
        let rebootStart = DispatchTime.now().uptimeNanoseconds
        try device.reboot()
        try await check(device)
        reboots.append(Double(DispatchTime.now().uptimeNanoseconds - rebootStart) / 1e6)
    }
    return (summary, perState, median(reboots))
}

// One add to a store of 20 notes: the check opens the store and runs SQLite's integrity check.
let notesDevice = try TestDevice()
let notesStore = try NotesStore(container: notesDevice.container)
for index in 0..<20 { try notesStore.add(title: "n\(index)", body: body) }
// The store closes after the add, so the reboots that follow can open the database again.
let notesCuts = try await measurePowerCuts(notesDevice, during: {
    try notesStore.add(title: "in flight", body: body)
    notesStore.close()
}, check: { device in
    try await device.unlock()
    let store = try NotesStore(container: device.container)
    defer { store.close() }
    try store.verifyIntegrity()
    let notes = try store.notes()
    precondition(notes.count >= 20)
})

// A small save, as in the testing guide: a settings file replaced whole.
let settingsPath = "Library/Preferences/settings.json"
let settingsDevice = try TestDevice()
try settingsDevice.container.write(Data(#"{"theme":"light"}"#.utf8), toPath: settingsPath)
let settingsCuts = try await measurePowerCuts(settingsDevice, during: {
    try settingsDevice.container.write(Data(#"{"theme":"dark"}"#.utf8), toPath: settingsPath)
}, check: { device in
    try await device.unlock()
    let settings = try device.container.contents(atPath: settingsPath)
    precondition(!settings.isEmpty)
})

print("power cuts (everyPowerCut): one notes add: \(notesCuts.summary); one settings save: \(settingsCuts.summary)")
print("milliseconds per state".padding(toLength: 44, withPad: " ", startingAt: 0) + "plain reboot   power-cut state   ratio")
for (name, measured) in [("notes add: bring up, unlock, open, check", notesCuts), ("settings save: bring up, unlock, read", settingsCuts)] {
    print(name.padding(toLength: 44, withPad: " ", startingAt: 0)
          + String(format: "%12.2f   %15.2f   %5.2f", measured.reboot, measured.perState, measured.perState / measured.reboot))
}
