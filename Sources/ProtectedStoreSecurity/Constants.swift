import Foundation
import ProtectedStore

// Security.framework's names, so code written against SecItem compiles here. On Apple's systems they are CFString
// constants; Linux's Foundation has no CoreFoundation types, so they are Strings with the same values, and
// `kSecClass as String` (the usual spelling) is a no-op there.

/// `CFDictionary`: Linux's Foundation has no CoreFoundation types; `query as CFDictionary` bridges to NSDictionary.
public typealias CFDictionary = NSDictionary
/// `CFTypeRef`: what a SecItem call returns into (`Data`, a dictionary of attributes or an array of them).
public typealias CFTypeRef = AnyObject
/// `CFString`.
public typealias CFString = NSString
/// `CFBoolean`.
public typealias CFBoolean = NSNumber
/// `kCFBooleanTrue`, implicitly unwrapped as on Apple's systems (both `kCFBooleanTrue` and `kCFBooleanTrue!` compile).
public let kCFBooleanTrue: CFBoolean! = NSNumber(value: true)
/// `kCFBooleanFalse`.
public let kCFBooleanFalse: CFBoolean! = NSNumber(value: false)

// MARK: Classes

public let kSecClass = "class"
public let kSecClassGenericPassword = "genp"
public let kSecClassInternetPassword = "inet"

// MARK: Attributes

public let kSecAttrService = "svce"
public let kSecAttrAccount = "acct"
public let kSecAttrServer = "srvr"
public let kSecAttrProtocol = "ptcl"
public let kSecAttrPort = "port"
public let kSecAttrPath = "path"
public let kSecAttrLabel = "labl"
public let kSecAttrGeneric = "gena"
public let kSecAttrAccessGroup = "agrp"
public let kSecAttrAccessible = "pdmn"
public let kSecAttrCreationDate = "cdat"
public let kSecAttrModificationDate = "mdat"
/// `kSecAttrSynchronizable`: accepted only as false (nothing here syncs), so code that sets it explicitly compiles.
public let kSecAttrSynchronizable = "sync"

// MARK: kSecAttrAccessible values

public let kSecAttrAccessibleWhenUnlocked = KeychainAccessibility.whenUnlocked.securityValue
public let kSecAttrAccessibleAfterFirstUnlock = KeychainAccessibility.afterFirstUnlock.securityValue
public let kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly = KeychainAccessibility.whenPasscodeSetThisDeviceOnly.securityValue
public let kSecAttrAccessibleWhenUnlockedThisDeviceOnly = KeychainAccessibility.whenUnlockedThisDeviceOnly.securityValue
public let kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly = KeychainAccessibility.afterFirstUnlockThisDeviceOnly.securityValue

// MARK: kSecAttrProtocol values (the common ones)

public let kSecAttrProtocolHTTP = "http"
public let kSecAttrProtocolHTTPS = "htps"
public let kSecAttrProtocolFTP = "ftp "
public let kSecAttrProtocolSSH = "ssh "
public let kSecAttrProtocolIMAP = "imap"
public let kSecAttrProtocolSMTP = "smtp"

// MARK: Values, returns and matching

public let kSecValueData = "v_Data"
public let kSecValuePersistentRef = "v_PersistentRef"
public let kSecReturnData = "r_Data"
public let kSecReturnAttributes = "r_Attributes"
public let kSecReturnPersistentRef = "r_PersistentRef"
public let kSecMatchLimit = "m_Limit"
public let kSecMatchLimitOne = "m_LimitOne"
public let kSecMatchLimitAll = "m_LimitAll"

// MARK: Status codes

public let errSecSuccess: OSStatus = 0
public let errSecParam = KeychainError.Code.param.rawValue
public let errSecDiskFull = KeychainError.Code.diskFull.rawValue
public let errSecIO = KeychainError.Code.io.rawValue
public let errSecNotAvailable = KeychainError.Code.notAvailable.rawValue
public let errSecDuplicateItem = KeychainError.Code.duplicateItem.rawValue
public let errSecItemNotFound = KeychainError.Code.itemNotFound.rawValue
public let errSecInteractionNotAllowed = KeychainError.Code.interactionNotAllowed.rawValue
public let errSecDecode = KeychainError.Code.decode.rawValue
public let errSecMissingEntitlement = KeychainError.Code.missingEntitlement.rawValue
